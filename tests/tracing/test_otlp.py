"""OTLP decoding: protobuf and OTLP/JSON (hex ids) into Reward and StoredSpan records; malformed input."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from tracing_helpers import as_otlp_json, sdk_spans

from agl_bridge import semconv
from agl_bridge.tracing.otlp import (
    OTLPDecodeError,
    UnsupportedMediaTypeError,
    decode_export_request,
)
from agl_bridge.types import Reward, StoredSpan

TRACE_HEX = "5b8efff798038103d269b633813fc60c"
SPAN_HEX = "eee19b7ec3c1b174"
PARENT_HEX = "eee19b7ec3c1b173"


def test_protobuf_request_decodes_rewards_and_generic_spans() -> None:
    spans = sdk_spans()
    records = decode_export_request(encode_spans(spans).SerializeToString(), "application/x-protobuf")
    by_name = {getattr(r, "name", None): r for r in records}
    tool = by_name["tool.search"]
    assert isinstance(tool, StoredSpan)
    source = next(s for s in spans if s.name == "tool.search")
    assert tool.trace_id == format(source.context.trace_id, "032x")
    assert tool.span_id == format(source.context.span_id, "016x")
    assert tool.parent_span_id == format(source.parent.span_id, "016x")  # type: ignore[union-attr]
    assert (tool.rollout_id, tool.attempt_id) == ("ro-1", "at-1")
    assert (tool.kind, tool.status, tool.status_message) == ("client", "error", "timeout")
    assert (tool.start_time_ns, tool.end_time_ns) == (source.start_time, source.end_time)
    assert tool.scope_name == "openinference.instrumentation.crewai"
    assert tool.resource["service.name"] == "agent"
    assert tool.attributes == {
        semconv.AGL_ROLLOUT_ID: "ro-1",
        semconv.AGL_ATTEMPT_ID: "at-1",
        "input.value": "what is 2+2?",
        "retries": 3,
        "score": 0.5,
        "cached": False,
        "tags": ["a", "b"],
        "ids": [1, 2, 3],
        "weird": "NaN",  # JSON has no NaN
    }
    kickoff = by_name["crew.kickoff"]
    assert isinstance(kickoff, StoredSpan) and kickoff.parent_span_id is None
    assert (kickoff.rollout_id, kickoff.attempt_id) == ("ro-1", None)
    reward = next(r for r in records if isinstance(r, Reward))
    source_reward = next(s for s in spans if s.name == semconv.SPAN_REWARD)
    assert (reward.rollout_id, reward.attempt_id, reward.name, reward.value) == ("ro-1", "at-1", "accuracy", 0.75)
    assert reward.span_id == format(source_reward.context.span_id, "016x")
    assert reward.timestamp == source_reward.end_time / 1e9  # type: ignore[operator]
    assert len(records) == 3


def test_otlp_json_decodes_to_the_same_records_as_protobuf() -> None:
    spans = sdk_spans()
    from_proto = decode_export_request(encode_spans(spans).SerializeToString(), "application/x-protobuf")
    body = json.dumps(as_otlp_json(spans)).encode()
    assert decode_export_request(body, "application/json; charset=utf-8") == from_proto


def handwritten_json(**span_overrides: Any) -> dict[str, Any]:
    """An OTLP/JSON request written as the spec shows it (ids hex, int64 as strings, enums as ints)."""
    span: dict[str, Any] = {
        "traceId": TRACE_HEX.upper(),  # hex is case-insensitive
        "spanId": SPAN_HEX,
        "parentSpanId": PARENT_HEX,
        "name": "tool.search",
        "kind": 3,
        "startTimeUnixNano": "1544712660000000000",
        "endTimeUnixNano": "1544712661000000000",
        "attributes": [
            {"key": "count", "value": {"intValue": "42"}},
            {"key": "ratio", "value": {"doubleValue": 0.5}},
            {"key": "inf", "value": {"doubleValue": "Infinity"}},
            {"key": "blob", "value": {"bytesValue": base64.b64encode(b"\x00\x01").decode()}},
            {"key": "nested", "value": {"kvlistValue": {"values": [{"key": "k", "value": {"boolValue": True}}]}}},
            {"key": "list", "value": {"arrayValue": {"values": [{"stringValue": "x"}, {"intValue": 1}]}}},
            {"key": "empty", "value": {}},
        ],
        "status": {"code": 1},
        "someFutureField": {"ignored": True},  # receivers must ignore unknown fields
    }
    span.update(span_overrides)
    return {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [
                        {"key": "service.name", "value": {"stringValue": "agent"}},
                        {"key": semconv.AGL_ROLLOUT_ID, "value": {"stringValue": "ro-res"}},
                        {"key": semconv.AGL_ATTEMPT_ID, "value": {"stringValue": "at-res"}},
                    ]
                },
                "scopeSpans": [{"scope": {"name": "my.lib"}, "spans": [span]}],
            }
        ]
    }


def test_handwritten_otlp_json_and_resource_attribution() -> None:
    (span,) = decode_export_request(json.dumps(handwritten_json()).encode(), "application/json")
    assert isinstance(span, StoredSpan)
    assert (span.trace_id, span.span_id, span.parent_span_id) == (TRACE_HEX, SPAN_HEX, PARENT_HEX)
    assert (span.kind, span.status, span.scope_name) == ("client", "ok", "my.lib")
    assert (span.start_time_ns, span.end_time_ns) == (1544712660000000000, 1544712661000000000)
    assert span.attributes == {
        "count": 42,
        "ratio": 0.5,
        "inf": "Infinity",
        "blob": "AAE=",
        "nested": {"k": True},
        "list": ["x", 1],
        "empty": None,
    }
    # No rollout on the span: the resource's pair applies.
    assert (span.rollout_id, span.attempt_id) == ("ro-res", "at-res")


def test_span_rollout_wins_and_the_pair_is_never_mixed() -> None:
    document = handwritten_json(attributes=[{"key": semconv.AGL_ROLLOUT_ID, "value": {"stringValue": "ro-span"}}])
    (span,) = decode_export_request(json.dumps(document).encode(), "application/json")
    assert (span.rollout_id, span.attempt_id) == ("ro-span", None)


def test_snake_case_field_names_are_accepted() -> None:
    document = {
        "resource_spans": [
            {
                "scope_spans": [
                    {
                        "spans": [
                            {
                                "trace_id": TRACE_HEX,
                                "span_id": SPAN_HEX,
                                "name": semconv.SPAN_REWARD,
                                "end_time_unix_nano": "2000000000",
                                "attributes": [
                                    {"key": semconv.AGL_ROLLOUT_ID, "value": {"string_value": "ro-1"}},
                                    {"key": semconv.AGL_REWARD_VALUE, "value": {"int_value": "2"}},
                                ],
                            }
                        ]
                    }
                ]
            }
        ]
    }
    (reward,) = decode_export_request(json.dumps(document).encode(), "application/json")
    assert isinstance(reward, Reward)
    assert (reward.rollout_id, reward.value, reward.name, reward.timestamp) == ("ro-1", 2.0, "reward", 2.0)


def test_empty_requests_decode_to_nothing() -> None:
    assert decode_export_request(b"", "application/x-protobuf") == []
    assert decode_export_request(b"{}", "application/json") == []


def reward_json(value: dict[str, Any] | None, **attributes: Any) -> bytes:
    attrs = [{"key": semconv.AGL_ROLLOUT_ID, "value": {"stringValue": "ro-1"}}]
    if value is not None:
        attrs.append({"key": semconv.AGL_REWARD_VALUE, "value": value})
    attrs += [{"key": k, "value": v} for k, v in attributes.items()]
    return json.dumps(handwritten_json(name=semconv.SPAN_REWARD, attributes=attrs)).encode()


@pytest.mark.parametrize(
    ("body", "content_type", "message"),
    [
        (b"\xff\xff\xff", "application/x-protobuf", "not a protobuf ExportTraceServiceRequest"),
        (b'{"resourceSpans": [', "application/json", "not valid JSON"),
        (b"[1, 2]", "application/json", "must be a JSON object"),
        (b'{"resourceSpans": 7}', "application/json", "not an OTLP/JSON ExportTraceServiceRequest"),
        (json.dumps(handwritten_json(traceId="xyz")).encode(), "application/json", "hex string"),
        (json.dumps(handwritten_json(spanId=12)).encode(), "application/json", "hex string"),
        (json.dumps(handwritten_json(traceId="abcd")).encode(), "application/json", "trace_id has 2 bytes"),
        (json.dumps(handwritten_json(spanId="0" * 16)).encode(), "application/json", "all zeros"),
        (
            json.dumps(handwritten_json(endTimeUnixNano=str(2**64 - 1))).encode(),
            "application/json",
            "past the year 2262",
        ),
        (
            json.dumps(
                handwritten_json(attributes=[{"key": semconv.AGL_ROLLOUT_ID, "value": {"intValue": "5"}}])
            ).encode(),
            "application/json",
            "agl.rollout_id must be a string",
        ),
        (reward_json(None), "application/json", "needs a agl.reward.value attribute"),
        (reward_json({"stringValue": "1.0"}), "application/json", "must be a finite int or double"),
        (reward_json({"doubleValue": "NaN"}), "application/json", "must be finite"),
        (reward_json({"doubleValue": 1.0}, **{semconv.AGL_REWARD_NAME: {"intValue": 3}}), "application/json", "name"),
        (b"[" * 100_000, "application/json", "not valid JSON"),
    ],
)
def test_malformed_bodies_raise_a_decode_error_with_the_reason(body: bytes, content_type: str, message: str) -> None:
    with pytest.raises(OTLPDecodeError, match=message):
        decode_export_request(body, content_type)


def test_span_errors_name_the_span() -> None:
    with pytest.raises(OTLPDecodeError, match=r"span 'agl.reward' \(resourceSpans\[0\].scopeSpans\[0\].spans\[0\]\)"):
        decode_export_request(reward_json(None), "application/json")


def test_unknown_content_type_is_its_own_error() -> None:
    with pytest.raises(UnsupportedMediaTypeError, match="text/plain"):
        decode_export_request(b"hello", "text/plain")
