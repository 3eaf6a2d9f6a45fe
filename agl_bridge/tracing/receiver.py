"""The OTLP/HTTP trace receiver: `POST /v1/traces` → rewards and generic spans in the store.

`make_traces_router(store)` returns a FastAPI `APIRouter` for the proxy to mount. A request is
answered 200 (an empty `ExportTraceServiceResponse` in the request's encoding) only after every
record in it is committed (invariant 4); an exporter that gets no 2xx retries, and a retried span is
stored once (span ids are unique in the store).

Errors use the OpenAI shape `{"error": {"message", "type", "param", "code"}}`:
  - 415: content type other than OTLP protobuf / JSON, or a content encoding other than gzip,
    deflate or identity;
  - 413: body (as sent, or once decompressed) above `max_body_bytes` (default 16 MiB);
  - 400: undecodable body (bad protobuf/JSON, broken gzip, a span that cannot be stored);
  - 503: the store could not commit (full disk, locked file, closed store) — OTLP exporters retry
    on 503;
  - 500: anything unexpected.

Attribution: a span's own `agl.rollout_id`/`agl.attempt_id`, else its resource's, else the
request's: the `rollout_id`/`attempt_id` path parameters when the router is also mounted under
`/rollout/{rollout_id}/attempt/{attempt_id}` (so an agent whose endpoint is its per-rollout base URL
works unchanged), else the `x-rollout-id`/`x-attempt-id` headers.

The router does no authentication; the proxy mounts it behind its own auth (pass `dependencies`).
A request the proxy's front door admitted with an agent key (its `AgentScope` in the request state,
`semconv.STATE_AGENT_SCOPE`) may only carry spans of that attempt and no reward: a span naming
another rollout or attempt, or a reward span, is a 403 and nothing of the request is stored —
rewards need the operator key (an agent must not grade itself).
"""

from __future__ import annotations

import dataclasses
import logging
import zlib
from collections.abc import Sequence

from fastapi import APIRouter, Request
from fastapi.params import Depends
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response

from agl_bridge import semconv
from agl_bridge.agent_keys import AgentScope
from agl_bridge.store.base import Store
from agl_bridge.store.errors import StoreClosedError, StoreWriteError
from agl_bridge.tracing.otlp import (
    JSON_MEDIA_TYPES,
    PROTOBUF_MEDIA_TYPES,
    DecodedSpan,
    OTLPDecodeError,
    UnsupportedMediaTypeError,
    decode_export_request,
    media_type,
)
from agl_bridge.tracing.sinks import store_records
from agl_bridge.types import Reward

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
"""Largest accepted request body, compressed or not (the OTLP exporters' batches stay far below)."""

INLINE_DECODE_BYTES = 64 * 1024
"""Uncompressed bodies up to this size are decoded on the event loop; larger or compressed ones on a
worker thread, so a big batch does not stall the proxy's other requests (a thread hop costs more
than decoding a single reward span)."""

_ENCODINGS = ("identity", "gzip", "deflate")
_logger = logging.getLogger(__name__)


class _HTTPError(Exception):
    """Internal: an error response to send."""

    def __init__(self, status: int, message: str, code: str, error_type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.error_type = error_type


def error_response(status: int, message: str, code: str, error_type: str = "invalid_request_error") -> JSONResponse:
    """An OpenAI-style error body: `{"error": {"message", "type", "param", "code"}}`."""
    return JSONResponse(
        {"error": {"message": message, "type": error_type, "param": None, "code": code}}, status_code=status
    )


def make_traces_router(
    store: Store,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    dependencies: Sequence[Depends] | None = None,
) -> APIRouter:
    """A router with `POST /v1/traces` writing into `store` (which must be open on the app's loop).

    dependencies: FastAPI dependencies run before the handler (e.g. the proxy's auth check).
    """
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be a positive integer, got {max_body_bytes!r}")
    router = APIRouter(dependencies=list(dependencies or ()))

    @router.post(semconv.OTLP_TRACES_PATH, summary="OTLP/HTTP trace export (protobuf or JSON)")
    async def receive_traces(request: Request) -> Response:
        """Decode an OTLP trace export, store its rewards and spans, answer once committed."""
        try:
            kind, encoding = _check_headers(request, max_body_bytes)
            body = await _read_body(request, max_body_bytes)
            if encoding == "identity" and len(body) <= INLINE_DECODE_BYTES:
                records = _decode(body, kind, encoding, max_body_bytes)
            else:
                records = await run_in_threadpool(_decode, body, kind, encoding, max_body_bytes)
            records = _attribute_unclaimed(records, _request_rollout(request))
            _check_scope(records, request.scope.get("state", {}).get(semconv.STATE_AGENT_SCOPE))
            await _store(store, records)
        except _HTTPError as exc:
            return error_response(exc.status, exc.message, exc.code, exc.error_type)
        except Exception as exc:  # a bug must still answer in the documented shape, and be logged
            _logger.exception("the OTLP trace receiver failed")
            message = f"the trace receiver failed unexpectedly: {exc}"
            return error_response(500, message, "internal_error", "server_error")
        if kind in PROTOBUF_MEDIA_TYPES:
            # An empty ExportTraceServiceResponse serializes to zero bytes.
            return Response(content=b"", media_type="application/x-protobuf")
        return JSONResponse({})

    return router


def _request_rollout(request: Request) -> tuple[str, str | None] | None:
    """The (rollout, attempt) named by the URL path parameters, else by the routing headers."""
    params = request.path_params
    rollout_id = params.get(semconv.PATH_PARAM_ROLLOUT_ID) or request.headers.get(semconv.HEADER_ROLLOUT_ID)
    if not rollout_id:
        return None
    if params.get(semconv.PATH_PARAM_ROLLOUT_ID):
        attempt_id = params.get(semconv.PATH_PARAM_ATTEMPT_ID)
    else:
        attempt_id = request.headers.get(semconv.HEADER_ATTEMPT_ID)
    return rollout_id, attempt_id or None


def _attribute_unclaimed(records: list[DecodedSpan], rollout: tuple[str, str | None] | None) -> list[DecodedSpan]:
    """Give records that carry no rollout (neither span nor resource named one) the request's."""
    if rollout is None:
        return records
    rollout_id, attempt_id = rollout
    return [
        dataclasses.replace(record, rollout_id=rollout_id, attempt_id=attempt_id)
        if record.rollout_id is None
        else record
        for record in records
    ]


def _check_scope(records: list[DecodedSpan], scope: object) -> None:
    """A 403 when a request made with an agent key (`scope`) carries a reward or another attempt's span."""
    if not isinstance(scope, AgentScope):
        return
    for record in records:
        if isinstance(record, Reward):
            message = (
                "an agent key cannot report rewards: the harness reports them with the operator key "
                "(emit_reward where it holds that key, or POST .../reward)"
            )
            raise _HTTPError(403, message, "forbidden", "permission_error")
        if record.rollout_id != scope.rollout_id or record.attempt_id != scope.attempt_id:
            message = "this agent key is scoped to another rollout attempt: send only spans of its own attempt"
            raise _HTTPError(403, message, "forbidden", "permission_error")


def _check_headers(request: Request, max_body_bytes: int) -> tuple[str, str]:
    content_type = request.headers.get("content-type", "")
    kind = media_type(content_type)
    if kind not in PROTOBUF_MEDIA_TYPES and kind not in JSON_MEDIA_TYPES:
        raise _HTTPError(415, str(UnsupportedMediaTypeError(content_type)), "unsupported_media_type")
    encoding = request.headers.get("content-encoding", "identity").strip().lower() or "identity"
    if encoding not in _ENCODINGS:
        raise _HTTPError(
            415,
            f"unsupported content encoding {encoding!r}; send the body uncompressed or as gzip or deflate",
            "unsupported_content_encoding",
        )
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            length = int(declared)
        except ValueError:
            raise _HTTPError(400, f"invalid Content-Length header {declared!r}", "invalid_content_length") from None
        if length > max_body_bytes:
            raise _too_large(f"the body is {length} bytes")
    return kind, encoding


def _too_large(what: str) -> _HTTPError:
    return _HTTPError(
        413,
        f"{what}, above this receiver's limit; send smaller batches (lower the exporter's "
        "max_export_batch_size) or raise the receiver's max_body_bytes",
        "payload_too_large",
    )


async def _read_body(request: Request, max_body_bytes: int) -> bytes:
    # Streamed with a running total, so a body without (or lying in) Content-Length cannot make us
    # buffer more than the limit.
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_body_bytes:
            raise _too_large(f"the body is over {max_body_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _decode(body: bytes, kind: str, encoding: str, max_body_bytes: int) -> list[DecodedSpan]:
    if encoding != "identity":
        body = _decompress(body, encoding, max_body_bytes)
    try:
        return decode_export_request(body, kind)
    except OTLPDecodeError as exc:
        raise _HTTPError(400, f"invalid OTLP trace export: {exc}", "invalid_otlp_body") from None


def _decompress(body: bytes, encoding: str, max_body_bytes: int) -> bytes:
    """Inflate gzip (several members allowed) or deflate (zlib or raw), never past the size limit."""
    if encoding == "gzip":
        return _inflate(body, 16 + zlib.MAX_WBITS, max_body_bytes, encoding)
    try:
        return _inflate(body, zlib.MAX_WBITS, max_body_bytes, encoding)
    except _HTTPError as exc:
        if exc.status != 400:
            raise
        # HTTP "deflate" is meant to be zlib-wrapped, but some clients send raw deflate.
        return _inflate(body, -zlib.MAX_WBITS, max_body_bytes, encoding)


def _inflate(data: bytes, wbits: int, max_body_bytes: int, encoding: str) -> bytes:
    out: list[bytes] = []
    size = 0
    while True:
        inflater = zlib.decompressobj(wbits)
        try:
            # A bounded output per call: a small "zip bomb" cannot expand past the limit in memory.
            chunk = inflater.decompress(data, max_body_bytes + 1 - size)
        except zlib.error as exc:
            raise _HTTPError(400, f"the body is not valid {encoding} data: {exc}", "invalid_content_encoding") from None
        size += len(chunk)
        if size > max_body_bytes or inflater.unconsumed_tail:
            raise _too_large(f"the decompressed body is over {max_body_bytes} bytes")
        out.append(chunk)
        if not inflater.eof:
            raise _HTTPError(400, f"the {encoding} body is truncated", "invalid_content_encoding")
        data = inflater.unused_data
        if wbits != 16 + zlib.MAX_WBITS or not data:  # only gzip has further members
            return b"".join(out)


async def _store(store: Store, records: list[DecodedSpan]) -> None:
    if not records:
        return
    try:
        await store_records(store, records)
    except (StoreWriteError, StoreClosedError) as exc:
        message = f"the store could not commit the spans: {exc}"
        raise _HTTPError(503, message, "store_unavailable", "server_error") from None
    except ValueError as exc:  # a record the store refuses (e.g. a value it cannot encode)
        raise _HTTPError(400, f"a span could not be stored: {exc}", "invalid_span") from None


__all__ = ["DEFAULT_MAX_BODY_BYTES", "error_response", "make_traces_router"]
