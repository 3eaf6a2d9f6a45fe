"""Where reward spans are delivered, synchronously: the store in this process, or a remote receiver.

Both sinks return only once the reward is durable in the store (the remote receiver answers 2xx
only after its commit), so the store allocates the reward's sequence number before `emit_reward`
returns: that is what orders a reward after the LLM calls that returned before it and before the
calls made after it.

  - `StoreSink(store, loop)`: the store lives in this process and was opened on `loop` (the proxy
    or trainer's event loop). Spans are encoded to OTLP and decoded by the same code the receiver
    uses, so a reward stored in-process is identical to one received over HTTP. The write goes
    from the caller's thread straight to the store's writer thread (a store serves every loop of
    its process), never through `loop`: that loop may be busy serving many agents' requests, and
    under load its backlog — not the commit — was what made rewards wait for seconds.
  - `RemoteSink(endpoint, api_key)`: exports with the standard OTLP/HTTP protobuf exporter to
    `{endpoint}/v1/traces`, with `Authorization: Bearer <api_key>` when a key is known.

`store_records` (writing decoded records to a store) is shared with the HTTP receiver.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan

from agl_bridge import semconv
from agl_bridge.tracing.context import normalize_endpoint
from agl_bridge.tracing.otlp import DecodedSpan, decode_request_message
from agl_bridge.types import Reward, StoredSpan

if TYPE_CHECKING:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from agl_bridge.store.base import Store

DEFAULT_TIMEOUT_S = 10.0
"""How long one delivery may take (retries included) unless `AGL_REWARD_TIMEOUT_S` says otherwise."""


class RewardDeliveryError(RuntimeError):
    """A reward could not be confirmed as stored. Treat it as not recorded.

    (After a timeout the store may still commit it late; the message says so when that can happen.)
    """


class RewardSink(Protocol):
    """A delivery target for reward spans; `deliver` returns once the spans are durably stored."""

    def deliver(self, spans: Sequence[ReadableSpan]) -> None:
        """Deliver from synchronous code; raises RewardDeliveryError on failure."""
        ...

    async def deliver_async(self, spans: Sequence[ReadableSpan]) -> None:
        """Deliver from async code without blocking the event loop; raises RewardDeliveryError."""
        ...


def default_timeout_s() -> float:
    """`AGL_REWARD_TIMEOUT_S` as a positive float, else DEFAULT_TIMEOUT_S; ValueError if malformed."""
    raw = os.environ.get(semconv.ENV_REWARD_TIMEOUT_S)
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise ValueError(
            f"environment variable {semconv.ENV_REWARD_TIMEOUT_S} must be a positive number of seconds, got {raw!r}"
        )
    return value


async def store_records(store: Store, records: Sequence[DecodedSpan]) -> None:
    """Durably write decoded records (rewards to `add_rewards`, other spans to `add_spans`).

    Both batches are queued before either is awaited, so they usually share one transaction.
    Within a batch, sequences follow request order; rewards are queued before generic spans.
    Returns only after both are committed; raises the first failure after both have finished.
    """
    rewards = [record for record in records if isinstance(record, Reward)]
    spans = [record for record in records if isinstance(record, StoredSpan)]
    writes = []
    if rewards:
        writes.append(store.add_rewards(rewards))
    if spans:
        writes.append(store.add_spans(spans))
    outcomes = await asyncio.gather(*writes, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome


def spans_to_records(spans: Sequence[ReadableSpan]) -> list[DecodedSpan]:
    """SDK spans → records, through the OTLP encoding the remote path uses (one mapping for both)."""
    return decode_request_message(encode_spans(spans))


class StoreSink:
    """Delivers reward spans to a store of this process, opened on `loop`.

    Thread-safe. From a thread other than the loop's, `deliver` hands the write to the store's
    writer thread and blocks until it is committed. From inside the loop's own thread a blocking
    wait would stall every request the loop serves (and a store whose writes needed that loop
    would deadlock), so `deliver` refuses with RewardDeliveryError and async code uses
    `deliver_async` (i.e. `await emit_reward_async(...)`).
    """

    def __init__(self, store: Store, loop: asyncio.AbstractEventLoop, *, timeout_s: float | None = None) -> None:
        if not isinstance(loop, asyncio.AbstractEventLoop):
            raise TypeError(f"StoreSink needs the event loop the store runs on, got {loop!r}")
        self.store = store
        self.loop = loop
        self.timeout_s = default_timeout_s() if timeout_s is None else timeout_s

    def __repr__(self) -> str:
        return f"StoreSink({self._describe()})"

    def _describe(self) -> str:
        return f"store {getattr(self.store, 'path', type(self.store).__name__)}"

    def deliver(self, spans: Sequence[ReadableSpan]) -> None:
        """Write the spans' records and wait for the commit, from this thread."""
        running = _running_loop()
        if running is self.loop:
            raise RewardDeliveryError(
                f"emit_reward() was called from inside the event loop that runs the {self._describe()}; "
                "waiting there for the write would deadlock that loop. In async code use "
                "`await emit_reward_async(...)` instead. The reward was not recorded."
            )
        if self.loop.is_closed() or not self.loop.is_running():
            raise RewardDeliveryError(
                f"the event loop of the {self._describe()} is not running, so the reward cannot be written; "
                "keep the loop that opened the store running while agents emit rewards (or register a new "
                "StoreSink with set_reward_sink). The reward was not recorded."
            )
        records = spans_to_records(spans)
        try:
            if running is None:  # a plain thread (an agent's): a private loop for the wait, not set as the thread's
                with asyncio.Runner(loop_factory=asyncio.new_event_loop) as runner:
                    runner.run(asyncio.wait_for(store_records(self.store, records), self.timeout_s))
            else:  # sync code inside another loop, which is blocked anyway: run the write on the store's
                future = asyncio.run_coroutine_threadsafe(store_records(self.store, records), self.loop)
                try:
                    future.result(timeout=self.timeout_s)
                except concurrent.futures.TimeoutError:
                    future.cancel()
                    raise TimeoutError from None
        except TimeoutError:
            raise RewardDeliveryError(self._timeout_message()) from None
        except Exception as exc:
            raise RewardDeliveryError(self._failure_message(exc)) from exc

    async def deliver_async(self, spans: Sequence[ReadableSpan]) -> None:
        """Write the spans' records from the calling loop (whichever it is) and await the commit."""
        records = spans_to_records(spans)
        try:
            if self.loop.is_closed() or not self.loop.is_running():
                raise RuntimeError("the event loop the store was opened on is not running")
            await asyncio.wait_for(store_records(self.store, records), self.timeout_s)
        except TimeoutError:
            raise RewardDeliveryError(self._timeout_message()) from None
        except Exception as exc:
            raise RewardDeliveryError(self._failure_message(exc)) from exc

    def _timeout_message(self) -> str:
        return (
            f"the {self._describe()} did not commit the reward within {self.timeout_s:g} s: its writer is "
            "behind (a slow or full disk, or another process holding the store's write lock). Treat the reward "
            "as not recorded (it may still be stored late, under this attempt). Check the store's disk and "
            f"which processes write to it, or raise {semconv.ENV_REWARD_TIMEOUT_S} if the store is just slow."
        )

    def _failure_message(self, exc: BaseException) -> str:
        return f"could not write the reward to the {self._describe()}: {exc}. The reward was not recorded."


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class RemoteSink:
    """Delivers reward spans to `{endpoint}/v1/traces` with the standard OTLP/HTTP protobuf exporter.

    `endpoint` is the proxy base URL (with or without `/v1`). The exporter retries transient
    failures (connection errors, 429, 502-504) until `timeout_s` is spent, then `deliver` raises
    RewardDeliveryError naming the URL and the last error. Each thread reuses its own exporter
    (and its HTTP connection), so concurrent agents never share a `requests.Session`.
    """

    def __init__(self, endpoint: str, api_key: str | None = None, *, timeout_s: float | None = None) -> None:
        self.endpoint = normalize_endpoint(endpoint)
        self.url = self.endpoint + semconv.OTLP_TRACES_PATH
        self.api_key = api_key
        self.timeout_s = default_timeout_s() if timeout_s is None else timeout_s

    def __repr__(self) -> str:
        return f"RemoteSink({self.url!r}, api_key={'set' if self.api_key else None})"

    def deliver(self, spans: Sequence[ReadableSpan]) -> None:
        """Export the spans and wait for the receiver's 2xx (sent only after its commit)."""
        exporter = self._exporter()
        from opentelemetry.sdk.trace.export import SpanExportResult

        with _capture_exporter_errors() as errors:
            try:
                result = exporter.export(spans)
            except Exception as exc:  # the exporter catches its own errors; this is belt and braces
                errors.append(str(exc))
                result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            raise RewardDeliveryError(
                f"could not deliver the reward to {self.url} ({_reason(errors)}). Check that the agl_bridge "
                f"proxy is running at {self.endpoint} ({semconv.ENV_ENDPOINT} or rollout_context(endpoint=...)) "
                f"and that the API key ({semconv.ENV_API_KEY} / {semconv.ENV_OPENAI_API_KEY}) is accepted. "
                f"A proxy that is up but overloaded, or whose store's writer is behind, may not confirm within "
                f"{self.timeout_s:g} s: raise {semconv.ENV_REWARD_TIMEOUT_S} then. The reward was not confirmed as "
                "stored; treat it as not recorded (the proxy may still store it late)."
            )

    async def deliver_async(self, spans: Sequence[ReadableSpan]) -> None:
        """`deliver` on a worker thread, so the event loop keeps running during the HTTP call."""
        await asyncio.to_thread(self.deliver, spans)

    def _exporter(self) -> OTLPSpanExporter:
        cache: dict[tuple[Any, ...], OTLPSpanExporter] = getattr(_THREAD_EXPORTERS, "cache", None) or {}
        _THREAD_EXPORTERS.cache = cache
        key = (self.url, self.api_key, self.timeout_s)
        exporter = cache.get(key)
        if exporter is None:
            # Imported here: it pulls in `requests`, which agents that never export should not pay for.
            from opentelemetry.exporter.otlp.proto.http import Compression
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
            exporter = OTLPSpanExporter(
                endpoint=self.url, headers=headers, timeout=self.timeout_s, compression=Compression.NoCompression
            )
            cache[key] = exporter
        return exporter


_THREAD_EXPORTERS = threading.local()

# The OTLP exporter reports why an export failed only in its log. A handler on its logger keeps
# the messages logged by the current thread while `_capture_exporter_errors` is active, so the
# RewardDeliveryError can say "code: 401, reason: Unauthorized" instead of just "failed".
_EXPORTER_LOGGER = "opentelemetry.exporter.otlp.proto.http.trace_exporter"
_CAPTURE = threading.local()


class _CaptureHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        buffer: list[str] | None = getattr(_CAPTURE, "buffer", None)
        if buffer is not None and record.levelno >= logging.WARNING:
            try:
                buffer.append(record.getMessage())
            except Exception:  # a malformed log record must not turn into a delivery failure
                pass


_HANDLER_LOCK = threading.Lock()
_handler_installed = False


@contextmanager
def _capture_exporter_errors() -> Iterator[list[str]]:
    """Collect the exporter's warning/error messages logged by this thread inside the block."""
    global _handler_installed
    if not _handler_installed:
        with _HANDLER_LOCK:
            if not _handler_installed:
                logging.getLogger(_EXPORTER_LOGGER).addHandler(_CaptureHandler(logging.WARNING))
                _handler_installed = True
    buffer: list[str] = []
    _CAPTURE.buffer = buffer
    try:
        yield buffer
    finally:
        _CAPTURE.buffer = None


def _reason(messages: list[str]) -> str:
    # The first message names the error (status code, connection refused); the last one says
    # why the exporter gave up (retries exhausted, timeout).
    unique = list(dict.fromkeys(messages))
    if not unique:
        return "the exporter logged no reason"
    return unique[0] if len(unique) == 1 else f"{unique[0]} ... {unique[-1]}"
