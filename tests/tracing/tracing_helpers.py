"""Helpers shared by the tracing tests: sample spans, a capturing reward sink, a live receiver server.

`ReceiverServer` runs a FastAPI app with `make_traces_router` and its own SQLiteStore under uvicorn
on 127.0.0.1 (a free port bound before start) in a background thread with its own event loop, like
the proxy would; tests read what it stored through a second store on the same file.
"""

from __future__ import annotations

import base64
import socket
import threading
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.params import Depends
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from agl_bridge import semconv
from agl_bridge.store import SQLiteStore
from agl_bridge.tracing.receiver import make_traces_router
from agl_bridge.tracing.sinks import spans_to_records


class CapturingSink:
    """A reward sink that keeps the decoded records instead of storing them (for precedence tests)."""

    def __init__(self) -> None:
        self.records: list[Any] = []
        self.threads: list[int] = []

    def deliver(self, spans: Sequence[Any]) -> None:
        self.threads.append(threading.get_ident())
        self.records.extend(spans_to_records(spans))

    async def deliver_async(self, spans: Sequence[Any]) -> None:
        self.deliver(spans)


class ReceiverServer:
    """uvicorn serving `make_traces_router` over a SQLiteStore, in a background thread."""

    def __init__(self, db_path: Path, dependencies: Sequence[Depends] | None = None) -> None:
        self.db_path = db_path
        self.store = SQLiteStore(db_path)
        app = FastAPI(lifespan=self._lifespan)
        router = make_traces_router(self.store, dependencies=dependencies)
        app.include_router(router)
        app.include_router(router, prefix="/rollout/{rollout_id}/attempt/{attempt_id}")  # as the proxy mounts it
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    @asynccontextmanager
    async def _lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        async with self.store:  # opened on the server's own loop, as the proxy will
            yield

    def start(self) -> None:
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test receiver did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=20)
        self._sock.close()

    @asynccontextmanager
    async def reader(self) -> AsyncIterator[SQLiteStore]:
        """A second store on the same file, on the caller's loop, to read what the server stored."""
        async with SQLiteStore(self.db_path) as reader:
            yield reader


def sdk_spans(resource: dict[str, Any] | None = None) -> list[ReadableSpan]:
    """A tool span (child, client kind, error status, varied attributes) and a reward span."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create(resource or {"service.name": "agent"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("openinference.instrumentation.crewai", "1.0")
    with tracer.start_as_current_span("crew.kickoff", attributes={semconv.AGL_ROLLOUT_ID: "ro-1"}):
        with tracer.start_as_current_span("tool.search", kind=SpanKind.CLIENT) as tool:
            tool.set_attributes(
                {
                    semconv.AGL_ROLLOUT_ID: "ro-1",
                    semconv.AGL_ATTEMPT_ID: "at-1",
                    "input.value": "what is 2+2?",
                    "retries": 3,
                    "score": 0.5,
                    "cached": False,
                    "tags": ["a", "b"],
                    "ids": [1, 2, 3],
                    "weird": float("nan"),
                }
            )
            tool.set_status(Status(StatusCode.ERROR, "timeout"))
        with tracer.start_as_current_span(
            semconv.SPAN_REWARD,
            attributes={
                semconv.AGL_ROLLOUT_ID: "ro-1",
                semconv.AGL_ATTEMPT_ID: "at-1",
                semconv.AGL_REWARD_NAME: "accuracy",
                semconv.AGL_REWARD_VALUE: 0.75,
            },
        ):
            pass
    return list(exporter.get_finished_spans())


def as_otlp_json(spans: list[ReadableSpan]) -> dict[str, Any]:
    """The OTLP/JSON form of spans: protobuf JSON mapping with hex instead of base64 ids."""
    document = json_format.MessageToDict(encode_spans(spans))
    for resource_spans in document["resourceSpans"]:
        for scope_spans in resource_spans["scopeSpans"]:
            for span in scope_spans["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return document
