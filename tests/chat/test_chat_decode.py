"""Sampled ids -> OpenAI assistant messages: end-of-turn stripping, tool-call parsing, finish reasons."""

from __future__ import annotations

import json
import re

from agl_bridge.chat import ChatCodec, parse_tool_calls
from agl_bridge.sampler.base import SamplingParams

CALL_ID = re.compile(r"^call_[0-9a-f]{24}$")


def test_stop_token_ids_come_from_the_tokenizer(codec: ChatCodec, tiny_tokenizer) -> None:
    im_end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    endoftext = tiny_tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert codec.stop_token_ids == (im_end, endoftext)
    params = SamplingParams(stop=list(codec.stop_token_ids))
    params.validate(vocab_size=len(tiny_tokenizer))
    assert params.stop_token_ids == codec.stop_token_ids
    with_extra = ChatCodec(tiny_tokenizer, extra_stop_token_ids=[5])
    assert with_extra.stop_token_ids == (im_end, endoftext, 5)


def test_plain_answer_strips_the_end_of_turn_token(codec: ChatCodec, tokens) -> None:
    ids = tokens.encode("Hello there, café!") + [tokens.im_end]
    message = codec.decode_response(ids, "stop")
    assert message.content == "Hello there, café!"
    assert message.text == "Hello there, café!"
    assert message.tool_calls == []
    assert message.finish_reason == "stop"
    assert message.to_openai() == {"role": "assistant", "content": "Hello there, café!"}

    by_endoftext = codec.decode_response(tokens.encode("Hi") + [tokens.endoftext], "stop")
    assert by_endoftext.content == "Hi"


def test_length_stop_keeps_everything(codec: ChatCodec, tokens) -> None:
    ids = tokens.encode("Hello wor")
    message = codec.decode_response(ids, "length")
    assert (message.content, message.finish_reason) == ("Hello wor", "length")
    # A stop token in the middle is text the model wrote, not the end of the turn.
    middle = codec.decode_response([tokens.im_end] + tokens.encode("x"), "length")
    assert middle.content == "<|im_end|>x"


def test_tool_calls_are_parsed(codec: ChatCodec, tokens) -> None:
    text = (
        "Let me check.\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>\n<tool_call>\n'
        '{"name": "add", "arguments": {"a": 1, "b": 2.5}}\n</tool_call>'
    )
    message = codec.decode_response(tokens.encode(text) + [tokens.im_end], "stop")
    assert message.finish_reason == "tool_calls"
    assert message.content == "Let me check."
    assert [c.function.name for c in message.tool_calls] == ["get_weather", "add"]
    assert message.tool_calls[0].function.arguments == '{"city": "Zürich"}'
    assert json.loads(message.tool_calls[1].function.arguments) == {"a": 1, "b": 2.5}
    assert all(CALL_ID.match(c.id) for c in message.tool_calls)
    assert message.tool_calls[0].id != message.tool_calls[1].id
    assert message.tool_call_errors == []
    openai = message.to_openai()
    assert openai["tool_calls"][0] == {
        "id": message.tool_calls[0].id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'},
    }


def test_tool_call_only_has_null_content(codec: ChatCodec, tokens) -> None:
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    message = codec.decode_response(tokens.encode(text) + [tokens.im_end], "stop")
    assert message.content is None
    assert message.to_openai()["content"] is None
    assert len(message.tool_calls) == 1


def test_bad_blocks_stay_in_content_and_are_reported() -> None:
    bad_json = '<tool_call>\n{"name": "add", "arguments": {"a": 1\n</tool_call>'
    no_name = '<tool_call>\n{"arguments": {}}\n</tool_call>'
    list_args = '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>'
    good = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    parsed = parse_tool_calls(f"Hi {bad_json} and {no_name}\n{list_args}\n{good}")
    assert [c.function.name for c in parsed.tool_calls] == ["add"]
    assert parsed.content == f"Hi {bad_json} and {no_name}\n{list_args}"
    reasons = [e.reason for e in parsed.errors]
    assert "not valid JSON" in reasons[0]
    assert 'no string "name"' in reasons[1]
    assert "must be a JSON object" in reasons[2]
    assert [e.block_index for e in parsed.errors] == [0, 1, 2]

    unterminated = parse_tool_calls('Sure <tool_call>\n{"name": "add", "argu')
    assert unterminated.tool_calls == []
    assert unterminated.content == 'Sure <tool_call>\n{"name": "add", "argu'
    assert "unterminated" in unterminated.errors[0].reason


def test_truncated_tool_call_is_content_with_length(codec: ChatCodec, tokens) -> None:
    message = codec.decode_response(tokens.encode('<tool_call>\n{"name": "add", "arguments": {"a"'), "length")
    assert message.finish_reason == "length"
    assert message.tool_calls == []
    assert message.content.startswith("<tool_call>")
    assert len(message.tool_call_errors) == 1


def test_arguments_keep_json_semantics() -> None:
    parsed = parse_tool_calls('<tool_call>\n{"name": "f", "arguments": {"b":1,"a":"日本"}}\n</tool_call>')
    # Key order and non-ASCII text are kept; separators become json.dumps' defaults.
    assert parsed.tool_calls[0].function.arguments == '{"b": 1, "a": "日本"}'
    as_string = parse_tool_calls('<tool_call>\n{"name": "f", "arguments": "{\\"a\\": 1}"}\n</tool_call>')
    assert as_string.tool_calls[0].function.arguments == '{"a": 1}'
    missing = parse_tool_calls('<tool_call>\n{"name": "f"}\n</tool_call>')
    assert missing.tool_calls[0].function.arguments == "{}"


def test_text_after_calls_is_kept_in_content() -> None:
    parsed = parse_tool_calls('Plan:\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\nThen I will answer.')
    assert parsed.content == "Plan:\nThen I will answer."
    assert len(parsed.tool_calls) == 1


def test_decoded_message_rerenders_as_sampled(codec: ChatCodec, tokens, weather_tools) -> None:
    """The template renders the decoded message back to exactly the sampled text + its marker."""
    history = [{"role": "user", "content": "Weather in Paris and 1+2?"}]
    for text in [
        "Checking.",
        "Two calls:\n\n<tool_call>\n" + '{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>',
    ]:
        ids = tokens.encode(text) + [tokens.im_end]
        message = codec.decode_response(ids, "stop").to_openai()
        before = codec.render(history, weather_tools, add_generation_prompt=True)
        after = codec.render(history + [message], weather_tools, add_generation_prompt=False)
        assert after == before + tokens.decode(ids) + "\n"
