"""OTLP trace export requests → agl_bridge records (`Reward` and `StoredSpan`). Data decoding only.

Two encodings arrive at `POST /v1/traces`:
  - `application/x-protobuf`: a serialized `ExportTraceServiceRequest` (opentelemetry-proto);
  - `application/json`: the OTLP/JSON encoding, i.e. the protobuf JSON mapping with two OTLP
    differences: `traceId`, `spanId`, `parentSpanId` (and those of links) are hex strings, not
    base64; and receivers must ignore unknown fields. We turn the hex ids into the base64 the
    protobuf JSON parser expects, then let `google.protobuf.json_format` do the rest (it takes
    lowerCamelCase and original field names, int64 as strings or numbers, enums as ints or names).

Both end in one `ExportTraceServiceRequest`, mapped by `decode_request_message`: a span named
`semconv.SPAN_REWARD` becomes a `Reward`, every other span a `StoredSpan`. Attribution comes from
the span's `agl.rollout_id` / `agl.attempt_id` attributes, or, when the span has no rollout id, from
those of its resource (the pair is taken from one place, never mixed).

Attribute values become JSON-safe values: strings, bools, ints and lists/dicts of them as is;
doubles as floats, except NaN and ±infinity, which become the strings "NaN", "Infinity",
"-Infinity" (standard JSON has no such numbers); bytes as base64 strings; an empty value as None.

A request with any span that cannot be turned into a record (wrong id length, a reward without a
finite numeric value, a non-string rollout id...) is refused as a whole with `OTLPDecodeError`,
naming the span and the reason: the sender gets a clear 400 instead of a silently dropped span.
Events and links are not stored.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterable
from typing import Any, TypeAlias

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from agl_bridge import semconv
from agl_bridge.types import DEFAULT_REWARD_NAME, Reward, SpanKind, SpanStatus, StoredSpan

DecodedSpan: TypeAlias = Reward | StoredSpan
"""What one OTLP span decodes to: a reward, or a generic span to store as is."""

PROTOBUF_MEDIA_TYPES = frozenset({"application/x-protobuf", "application/protobuf"})
"""Content types of binary OTLP (the spec's is the first; the second is its IANA-style alias)."""

JSON_MEDIA_TYPES = frozenset({"application/json"})
"""Content types of OTLP/JSON."""

_SPAN_KINDS: tuple[SpanKind, ...] = ("unspecified", "internal", "server", "client", "producer", "consumer")
_STATUS_CODES: dict[int, SpanStatus] = {
    Status.STATUS_CODE_UNSET: "unset",
    Status.STATUS_CODE_OK: "ok",
    Status.STATUS_CODE_ERROR: "error",
}
_MAX_NS = 2**63 - 1


class OTLPDecodeError(ValueError):
    """The body is not a valid OTLP trace export request, or one of its spans cannot be stored."""


class UnsupportedMediaTypeError(OTLPDecodeError):
    """The content type is neither OTLP protobuf nor OTLP/JSON."""

    def __init__(self, content_type: str) -> None:
        supported = ", ".join(sorted(PROTOBUF_MEDIA_TYPES | JSON_MEDIA_TYPES))
        super().__init__(
            f"unsupported content type {content_type!r} for an OTLP trace export; send one of {supported} "
            "(OTLP/HTTP exporters do this by default)"
        )
        self.content_type = content_type


def media_type(content_type: str | None) -> str:
    """The lower-cased media type of a Content-Type header value, parameters dropped."""
    return (content_type or "").split(";", 1)[0].strip().lower()


def decode_export_request(body: bytes, content_type: str) -> list[DecodedSpan]:
    """Decode an (uncompressed) OTLP trace export body into records, in request order.

    Raises UnsupportedMediaTypeError for a content type other than OTLP protobuf or JSON, and
    OTLPDecodeError with the reason for a malformed body or an unstorable span.
    """
    kind = media_type(content_type)
    if kind in PROTOBUF_MEDIA_TYPES:
        request = parse_protobuf(body)
    elif kind in JSON_MEDIA_TYPES:
        request = parse_json(body)
    else:
        raise UnsupportedMediaTypeError(content_type)
    return decode_request_message(request)


def parse_protobuf(body: bytes) -> ExportTraceServiceRequest:
    """Parse a binary `ExportTraceServiceRequest`; OTLPDecodeError if it is not one."""
    try:
        return ExportTraceServiceRequest.FromString(body)
    except (DecodeError, RecursionError, ValueError) as exc:
        raise OTLPDecodeError(
            f"the body is not a protobuf ExportTraceServiceRequest ({exc or type(exc).__name__}); "
            "send the bytes of opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest"
        ) from None


def parse_json(body: bytes) -> ExportTraceServiceRequest:
    """Parse an OTLP/JSON trace export request (hex ids); OTLPDecodeError with the reason if invalid."""
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise OTLPDecodeError(f"the body is not valid JSON: {exc or type(exc).__name__}") from None
    if not isinstance(document, dict):
        raise OTLPDecodeError(
            f"an OTLP/JSON trace export must be a JSON object with a 'resourceSpans' list, got a "
            f"{type(document).__name__}"
        )
    _hex_ids_to_base64(document)
    try:
        return json_format.ParseDict(document, ExportTraceServiceRequest(), ignore_unknown_fields=True)
    except (json_format.ParseError, RecursionError, ValueError, TypeError) as exc:
        raise OTLPDecodeError(f"the body is not an OTLP/JSON ExportTraceServiceRequest: {exc}") from None


def _field(obj: dict[str, Any], camel: str, snake: str) -> tuple[str | None, Any]:
    """The key used (lowerCamelCase or original proto name) and its value, or (None, None)."""
    for key in (camel, snake):
        if key in obj:
            return key, obj[key]
    return None, None


def _dicts(value: Any) -> Iterable[dict[str, Any]]:
    # Wrong shapes are left for the protobuf parser to report with its own precise message.
    if isinstance(value, list):
        return (item for item in value if isinstance(item, dict))
    return ()


def _hex_ids_to_base64(document: dict[str, Any]) -> None:
    """Rewrite the hex id strings of OTLP/JSON spans and links in place as base64 for json_format."""
    for resource_spans in _dicts(_field(document, "resourceSpans", "resource_spans")[1]):
        for scope_spans in _dicts(_field(resource_spans, "scopeSpans", "scope_spans")[1]):
            for span in _dicts(scope_spans.get("spans")):
                _convert_ids(span, ("traceId", "trace_id"), ("spanId", "span_id"), ("parentSpanId", "parent_span_id"))
                for link in _dicts(span.get("links")):
                    _convert_ids(link, ("traceId", "trace_id"), ("spanId", "span_id"))


def _convert_ids(obj: dict[str, Any], *names: tuple[str, str]) -> None:
    for camel, snake in names:
        key, value = _field(obj, camel, snake)
        if key is None or value is None:
            continue
        if not isinstance(value, str):
            raise OTLPDecodeError(f"OTLP/JSON {camel} must be a hex string, got {value!r}")
        try:
            raw = bytes.fromhex(value)
        except ValueError:
            raise OTLPDecodeError(
                f"OTLP/JSON {camel} must be a hex string (OTLP/JSON encodes ids as hex, not base64), got {value!r}"
            ) from None
        obj[key] = base64.b64encode(raw).decode("ascii")


def decode_request_message(request: ExportTraceServiceRequest) -> list[DecodedSpan]:
    """Map every span of a parsed request to a `Reward` or a `StoredSpan`, in request order."""
    records: list[DecodedSpan] = []
    for r_index, resource_spans in enumerate(request.resource_spans):
        resource = attributes_to_dict(resource_spans.resource.attributes)
        for s_index, scope_spans in enumerate(resource_spans.scope_spans):
            scope_name = scope_spans.scope.name or None
            for index, span in enumerate(scope_spans.spans):
                where = f"span {span.name!r} (resourceSpans[{r_index}].scopeSpans[{s_index}].spans[{index}])"
                try:
                    records.append(_decode_span(span, resource, scope_name))
                except ValueError as exc:
                    raise OTLPDecodeError(f"{where} cannot be stored: {exc}") from None
    return records


def _decode_span(span: Span, resource: dict[str, Any], scope_name: str | None) -> DecodedSpan:
    attributes = attributes_to_dict(span.attributes)
    rollout_id, attempt_id = _attribution(attributes, resource)
    trace_id = _hex_id("trace_id", span.trace_id, 16)
    span_id = _hex_id("span_id", span.span_id, 8)
    if span.name == semconv.SPAN_REWARD:
        return _decode_reward(span, attributes, rollout_id, attempt_id, trace_id, span_id)
    return StoredSpan(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        name=span.name,
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=_hex_id("parent_span_id", span.parent_span_id, 8) if span.parent_span_id else None,
        kind=_SPAN_KINDS[span.kind] if 0 <= span.kind < len(_SPAN_KINDS) else "unspecified",
        start_time_ns=_ns("start_time_unix_nano", span.start_time_unix_nano),
        end_time_ns=_ns("end_time_unix_nano", span.end_time_unix_nano),
        attributes=attributes,
        resource=resource,
        scope_name=scope_name,
        status=_STATUS_CODES.get(span.status.code, "unset"),
        status_message=span.status.message or None,
    )


def _decode_reward(
    span: Span,
    attributes: dict[str, Any],
    rollout_id: str | None,
    attempt_id: str | None,
    trace_id: str,
    span_id: str,
) -> Reward:
    value = _reward_value(span)
    name = attributes.get(semconv.AGL_REWARD_NAME, DEFAULT_REWARD_NAME)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{semconv.AGL_REWARD_NAME} must be a non-empty string, got {name!r}")
    reward = Reward(
        rollout_id=rollout_id, attempt_id=attempt_id, value=value, name=name, span_id=span_id, trace_id=trace_id
    )
    # The span's end is when the agent emitted the reward; a span without times keeps the ingest time.
    ended_ns = span.end_time_unix_nano or span.start_time_unix_nano
    if ended_ns:
        reward.timestamp = _ns("end_time_unix_nano", ended_ns) / 1e9
    return reward


def _reward_value(span: Span) -> float:
    found: AnyValue | None = None
    for item in span.attributes:
        if item.key == semconv.AGL_REWARD_VALUE:
            found = item.value  # the last one wins, as in attributes_to_dict
    if found is None:
        raise ValueError(f"a reward span needs a {semconv.AGL_REWARD_VALUE} attribute (a finite number); it has none")
    which = found.WhichOneof("value")
    if which == "double_value":
        value = found.double_value
    elif which == "int_value":
        value = float(found.int_value)
    else:
        raise ValueError(
            f"{semconv.AGL_REWARD_VALUE} must be a finite int or double attribute, got {any_value_to_json(found)!r} "
            f"({which or 'empty'})"
        )
    if not math.isfinite(value):
        raise ValueError(f"{semconv.AGL_REWARD_VALUE} must be finite, got {value!r}")
    return value


def _attribution(attributes: dict[str, Any], resource: dict[str, Any]) -> tuple[str | None, str | None]:
    source = attributes if attributes.get(semconv.AGL_ROLLOUT_ID) not in (None, "") else resource
    rollout_id = source.get(semconv.AGL_ROLLOUT_ID)
    attempt_id = source.get(semconv.AGL_ATTEMPT_ID)
    for key, value in ((semconv.AGL_ROLLOUT_ID, rollout_id), (semconv.AGL_ATTEMPT_ID, attempt_id)):
        if value is not None and not isinstance(value, str):
            raise ValueError(f"attribute {key} must be a string, got {value!r}")
    return rollout_id or None, attempt_id or None


def _hex_id(name: str, raw: bytes, n_bytes: int) -> str:
    if len(raw) != n_bytes:
        raise ValueError(f"{name} has {len(raw)} bytes; OTLP {name}s are {n_bytes} bytes")
    if not any(raw):
        raise ValueError(f"{name} is all zeros, which OpenTelemetry defines as invalid")
    return raw.hex()


def _ns(name: str, value: int) -> int:
    if value > _MAX_NS:
        raise ValueError(f"{name} {value} is past the year 2262; expected nanoseconds since the Unix epoch")
    return value


def attributes_to_dict(attributes: Iterable[KeyValue]) -> dict[str, Any]:
    """OTLP key/values → a JSON-safe dict (a repeated key: the last value wins)."""
    return {item.key: any_value_to_json(item.value) for item in attributes}


def any_value_to_json(value: AnyValue) -> Any:
    """One OTLP `AnyValue` → a JSON-safe Python value (see the module docstring for the mapping)."""
    which = value.WhichOneof("value")
    if which == "string_value":
        return value.string_value
    if which == "bool_value":
        return value.bool_value
    if which == "int_value":
        return value.int_value
    if which == "double_value":
        number = value.double_value
        if math.isfinite(number):
            return number
        return "NaN" if math.isnan(number) else ("Infinity" if number > 0 else "-Infinity")
    if which == "array_value":
        return [any_value_to_json(item) for item in value.array_value.values]
    if which == "kvlist_value":
        return attributes_to_dict(value.kvlist_value.values)
    if which == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")
    return None


__all__ = [
    "JSON_MEDIA_TYPES",
    "PROTOBUF_MEDIA_TYPES",
    "DecodedSpan",
    "OTLPDecodeError",
    "UnsupportedMediaTypeError",
    "any_value_to_json",
    "attributes_to_dict",
    "decode_export_request",
    "decode_request_message",
    "media_type",
    "parse_json",
    "parse_protobuf",
]
