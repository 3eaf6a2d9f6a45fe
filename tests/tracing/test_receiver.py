"""The /v1/traces router: encodings, durability before 2xx, re-delivery, and 400/413/415/503 errors."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import Depends, FastAPI, HTTPException, Request
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from shared_helpers import collect
from tracing_helpers import as_otlp_json, sdk_spans

from agl_bridge.store import SQLiteStore
from agl_bridge.tracing import make_traces_router

PROTOBUF = {"content-type": "application/x-protobuf"}


def client_for(store: SQLiteStore, **router_options: Any) -> httpx.AsyncClient:
    app = FastAPI()
    app.include_router(make_traces_router(store, **router_options))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://receiver")


@pytest.fixture
async def client(store: SQLiteStore) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(store) as opened:
        yield opened


def protobuf_body() -> bytes:
    return encode_spans(sdk_spans()).SerializeToString()


def assert_error(response: httpx.Response, status: int, code: str, *phrases: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and error["param"] is None
    assert error["type"] == ("server_error" if status >= 500 else "invalid_request_error")
    for phrase in phrases:
        assert phrase in error["message"], error["message"]


async def stored(store: SQLiteStore) -> tuple[list[Any], list[Any]]:
    return await collect(store.iter_all_rewards()), await collect(store.iter_all_spans())


async def test_protobuf_export_is_stored_before_an_empty_protobuf_response(
    client: httpx.AsyncClient, store: SQLiteStore
) -> None:
    response = await client.post("/v1/traces", content=protobuf_body(), headers=PROTOBUF)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-protobuf"
    assert ExportTraceServiceResponse.FromString(response.content) == ExportTraceServiceResponse()
    rewards, spans = await stored(store)
    assert [(r.rollout_id, r.attempt_id, r.name, r.value) for r in rewards] == [("ro-1", "at-1", "accuracy", 0.75)]
    assert sorted(s.name for s in spans) == ["crew.kickoff", "tool.search"]
    # One sequence space per (rollout, attempt): the reward and the tool span of ro-1/at-1 differ.
    tool = next(s for s in spans if s.name == "tool.search")
    assert tool.sequence != rewards[0].sequence


async def test_json_export_gets_a_json_response(client: httpx.AsyncClient, store: SQLiteStore) -> None:
    body = json.dumps(as_otlp_json(sdk_spans())).encode()
    response = await client.post("/v1/traces", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 200 and response.json() == {}
    rewards, spans = await stored(store)
    assert len(rewards) == 1 and len(spans) == 2


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [
        ("gzip", gzip.compress),
        ("GZIP", lambda data: gzip.compress(data[:10]) + gzip.compress(data[10:])),  # two gzip members
        ("deflate", zlib.compress),
        ("deflate", lambda data: zlib.compress(data)[2:-4]),  # raw deflate, as some clients send
    ],
)
async def test_compressed_bodies_are_accepted(
    client: httpx.AsyncClient, store: SQLiteStore, encoding: str, compress: Any
) -> None:
    headers = {**PROTOBUF, "content-encoding": encoding}
    response = await client.post("/v1/traces", content=compress(protobuf_body()), headers=headers)
    assert response.status_code == 200, response.text
    rewards, spans = await stored(store)
    assert len(rewards) == 1 and len(spans) == 2


async def test_redelivered_spans_are_stored_once(client: httpx.AsyncClient, store: SQLiteStore) -> None:
    body = protobuf_body()
    for _ in range(3):  # an exporter retrying after a lost response
        assert (await client.post("/v1/traces", content=body, headers=PROTOBUF)).status_code == 200
    rewards, spans = await stored(store)
    assert len(rewards) == 1 and len(spans) == 2


async def test_undecodable_bodies_are_400(client: httpx.AsyncClient, store: SQLiteStore) -> None:
    response = await client.post("/v1/traces", content=b"\xff\xff\xff", headers=PROTOBUF)
    assert_error(response, 400, "invalid_otlp_body", "not a protobuf ExportTraceServiceRequest")
    response = await client.post("/v1/traces", content=b"{", headers={"content-type": "application/json"})
    assert_error(response, 400, "invalid_otlp_body", "not valid JSON")
    response = await client.post(
        "/v1/traces", content=b"not gzip at all", headers={**PROTOBUF, "content-encoding": "gzip"}
    )
    assert_error(response, 400, "invalid_content_encoding", "not valid gzip")
    response = await client.post(
        "/v1/traces", content=gzip.compress(protobuf_body())[:-12], headers={**PROTOBUF, "content-encoding": "gzip"}
    )
    assert_error(response, 400, "invalid_content_encoding", "truncated")
    assert await stored(store) == ([], [])


async def test_a_bad_span_refuses_the_whole_request(client: httpx.AsyncClient, store: SQLiteStore) -> None:
    document = as_otlp_json(sdk_spans())
    spans = document["resourceSpans"][0]["scopeSpans"][0]["spans"]
    reward = next(s for s in spans if s["name"] == "agl.reward")
    reward["attributes"] = [a for a in reward["attributes"] if a["key"] != "agl.reward.value"]
    response = await client.post(
        "/v1/traces", content=json.dumps(document).encode(), headers={"content-type": "application/json"}
    )
    assert_error(response, 400, "invalid_otlp_body", "agl.reward.value")
    assert await stored(store) == ([], [])


@pytest.mark.parametrize(
    ("headers", "code", "phrase"),
    [
        ({"content-type": "text/plain"}, "unsupported_media_type", "text/plain"),
        ({}, "unsupported_media_type", "application/x-protobuf"),
        ({**PROTOBUF, "content-encoding": "br"}, "unsupported_content_encoding", "'br'"),
    ],
)
async def test_unknown_content_types_and_encodings_are_415(
    client: httpx.AsyncClient, headers: dict[str, str], code: str, phrase: str
) -> None:
    assert_error(await client.post("/v1/traces", content=b"x", headers=headers), 415, code, phrase)


async def test_bodies_over_the_limit_are_413_compressed_or_not(store: SQLiteStore) -> None:
    async with client_for(store, max_body_bytes=4096) as small:
        response = await small.post("/v1/traces", content=b"\x00" * 5000, headers=PROTOBUF)
        assert_error(response, 413, "payload_too_large", "5000 bytes", "max_body_bytes")

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted while streaming
            for _ in range(10):
                yield b"\x00" * 1000

        response = await small.post("/v1/traces", content=chunks(), headers=PROTOBUF)
        assert_error(response, 413, "payload_too_large", "over 4096 bytes")
        bomb = gzip.compress(b"\x00" * 10_000_000)  # ~10 KB that inflates to 10 MB
        assert len(bomb) < 4096 * 4
        response = await small.post("/v1/traces", content=bomb[:4000], headers={**PROTOBUF, "content-encoding": "gzip"})
        assert_error(response, 413, "payload_too_large", "decompressed body")
    assert await stored(store) == ([], [])


async def test_large_bodies_are_decoded_off_the_loop_and_stored(client: httpx.AsyncClient, store: SQLiteStore) -> None:
    many = [span for _ in range(201) for span in sdk_spans()]  # every call makes new span ids
    body = encode_spans(many).SerializeToString()
    assert len(body) > 64 * 1024
    assert (await client.post("/v1/traces", content=body, headers=PROTOBUF)).status_code == 200
    rewards, spans = await stored(store)
    assert len(rewards) == 201 and len(spans) == 402


async def test_store_failures_are_503_so_exporters_retry(tmp_path: Path) -> None:
    never_opened = SQLiteStore(tmp_path / "closed.db")
    async with client_for(never_opened) as closed:
        response = await closed.post("/v1/traces", content=protobuf_body(), headers=PROTOBUF)
    assert_error(response, 503, "store_unavailable", "not open")


async def test_unexpected_failures_are_500_in_the_same_shape(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(store: Any, records: Any) -> None:
        raise RuntimeError("disk gremlins")

    monkeypatch.setattr("agl_bridge.tracing.receiver.store_records", broken)
    response = await client.post("/v1/traces", content=protobuf_body(), headers=PROTOBUF)
    assert_error(response, 500, "internal_error", "disk gremlins")


async def test_dependencies_guard_the_route(store: SQLiteStore) -> None:
    def require_key(request: Request) -> None:
        if request.headers.get("authorization") != "Bearer sk-good":
            raise HTTPException(status_code=401, detail="bad key")

    async with client_for(store, dependencies=[Depends(require_key)]) as guarded:
        assert (await guarded.post("/v1/traces", content=protobuf_body(), headers=PROTOBUF)).status_code == 401
        assert await stored(store) == ([], [])
        headers = {**PROTOBUF, "authorization": "Bearer sk-good"}
        assert (await guarded.post("/v1/traces", content=protobuf_body(), headers=headers)).status_code == 200


def unattributed_json() -> bytes:
    document = as_otlp_json(sdk_spans(resource={"service.name": "agent"}))
    for span in document["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        if span["name"] == "crew.kickoff":
            span["attributes"] = []  # this span names no rollout; the others keep ro-1
    return json.dumps(document).encode()


async def test_unattributed_spans_take_the_rollout_of_the_url_or_headers(store: SQLiteStore) -> None:
    app = FastAPI()
    router = make_traces_router(store)
    app.include_router(router)
    app.include_router(router, prefix="/rollout/{rollout_id}/attempt/{attempt_id}")
    json_type = {"content-type": "application/json"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as proxy:
        path = "/rollout/ro-p/attempt/at-p/v1/traces"
        assert (await proxy.post(path, content=unattributed_json(), headers=json_type)).status_code == 200
        headers = {**json_type, "x-rollout-id": "ro-h", "x-attempt-id": "at-h"}
        assert (await proxy.post("/v1/traces", content=unattributed_json(), headers=headers)).status_code == 200
        assert (await proxy.post("/v1/traces", content=unattributed_json(), headers=json_type)).status_code == 200
    spans = await collect(store.iter_all_spans())
    kickoffs = sorted((s.rollout_id or "", s.attempt_id or "") for s in spans if s.name == "crew.kickoff")
    assert kickoffs == [("", ""), ("ro-h", "at-h"), ("ro-p", "at-p")]
    # Spans that named their rollout keep it whatever the URL says.
    assert {(s.rollout_id, s.attempt_id) for s in spans if s.name == "tool.search"} == {("ro-1", "at-1")}
    assert {(r.rollout_id, r.attempt_id) for r in await collect(store.iter_all_rewards())} == {("ro-1", "at-1")}


def test_router_options_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_body_bytes must be a positive integer"):
        make_traces_router(SQLiteStore(tmp_path / "s.db"), max_body_bytes=0)
