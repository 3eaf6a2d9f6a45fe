"""Validation and normalisation of OpenAI messages/tools: every error names its field."""

from __future__ import annotations

import pytest

from agl_bridge.chat import ChatCodec, ChatFormatError, normalize_messages, normalize_tools

USER = {"role": "user", "content": "hi"}


def _error(call, *args, **kwargs) -> ChatFormatError:
    with pytest.raises(ChatFormatError) as info:
        call(*args, **kwargs)
    assert isinstance(info.value, ValueError)
    return info.value


@pytest.mark.parametrize(
    ("messages", "param", "needle"),
    [
        ([], "messages", "at least one message"),
        ("hello", "messages", "must be a list"),
        ([USER, "oops"], "messages[1]", "must be an object"),
        ([USER, {"content": "x"}], "messages[1].role", "is required"),
        ([USER, {"role": "robot", "content": "x"}], "messages[1].role", "'robot' is not supported"),
        ([{"role": "function", "content": "x"}], "messages[0].role", "system, developer, user, assistant, tool"),
        ([{"role": "user"}], "messages[0].content", "is required"),
        ([{"role": "user", "content": None}], "messages[0].content", "is required"),
        ([{"role": "user", "content": 3}], "messages[0].content", "string or a list of text parts"),
        (
            [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}],
                }
            ],
            "messages[0].content[1].type",
            "only text content parts are supported",
        ),
        (
            [{"role": "user", "content": [{"type": "text", "text": 5}]}],
            "messages[0].content[0].text",
            "must be a string",
        ),
        ([USER, {"role": "assistant", "content": None}], "messages[1].content", "use an empty string"),
        ([USER, {"role": "assistant"}], "messages[1].content", "without tool_calls"),
        ([USER, {"role": "tool", "content": "42"}], "messages[1].tool_call_id", "tool_call_id is required"),
        (
            [
                USER,
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"type": "function", "function": {"arguments": "{}"}}],
                },
            ],
            "messages[1].tool_calls[0].function.name",
            "non-empty string",
        ),
        (
            [
                USER,
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": 3}}],
                },
            ],
            "messages[1].tool_calls[0].function.arguments",
            "JSON string",
        ),
        (
            [USER, {"role": "assistant", "content": "", "tool_calls": [{"type": "code", "function": {"name": "f"}}]}],
            "messages[1].tool_calls[0].type",
            "must be 'function'",
        ),
        ([USER, {"role": "assistant", "content": "", "tool_calls": {"x": 1}}], "messages[1].tool_calls", "list"),
        ([{"role": "user", "content": "x", "name": 7}], "messages[0].name", "must be a string"),
    ],
)
def test_bad_messages_name_the_field(messages, param: str, needle: str) -> None:
    error = _error(normalize_messages, messages)
    assert error.param == param
    assert needle in str(error)


@pytest.mark.parametrize(
    ("tools", "param", "needle"),
    [
        ({"type": "function"}, "tools", "must be a list"),
        ([{"type": "retrieval"}], "tools[0].type", "must be 'function'"),
        ([{"type": "function"}], "tools[0].function", "must be an object"),
        ([{"type": "function", "function": {"description": "x"}}], "tools[0].function.name", "non-empty string"),
        (
            [{"type": "function", "function": {"name": "f", "parameters": "{}"}}],
            "tools[0].function.parameters",
            "JSON Schema object",
        ),
        (
            [{"type": "function", "function": {"name": "f", "description": 1}}],
            "tools[0].function.description",
            "string",
        ),
    ],
)
def test_bad_tools_name_the_field(tools, param: str, needle: str) -> None:
    error = _error(normalize_tools, tools)
    assert error.param == param
    assert needle in str(error)


def test_normalisation() -> None:
    messages = [
        {"role": "developer", "content": "be brief"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "line one"}, {"type": "text", "text": "line two"}],
            "name": "ann",
        },
        {
            "role": "assistant",
            "content": None,
            "refusal": None,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "2"}]},
        {"role": "assistant", "content": "done", "tool_calls": [], "reasoning_content": "because"},
    ]
    assert normalize_messages(messages) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "name": "ann", "content": "line one\nline two"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
        },
        {"role": "tool", "content": "2", "tool_call_id": "call_1"},
        {"role": "assistant", "content": "done", "reasoning_content": "because"},
    ]
    # The caller's objects are not modified.
    assert messages[0]["role"] == "developer"


def test_tools_keep_key_order_and_are_copies(weather_tools) -> None:
    normalized = normalize_tools(weather_tools)
    assert normalized == weather_tools
    assert list(normalized[0]["function"]) == ["name", "description", "parameters"]
    normalized[0]["function"]["name"] = "changed"
    assert weather_tools[0]["function"]["name"] == "get_weather"
    assert normalize_tools([]) is None
    assert normalize_tools(None) is None


def test_codec_reports_template_options_and_template_rejections(codec: ChatCodec, with_template) -> None:
    error = _error(codec.encode_prompt, [USER], chat_template_kwargs={"tokenize": True})
    assert error.param == "chat_template_kwargs.tokenize"
    error = _error(codec.encode_prompt, [USER], chat_template_kwargs=["enable_thinking"])
    assert error.param == "chat_template_kwargs"

    strict = ChatCodec(
        with_template(
            "{%- for m in messages %}{%- if m.role == 'system' and not loop.first %}"
            "{{ raise_exception('System message must be first') }}{%- endif %}"
            "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
        )
    )
    error = _error(strict.encode_prompt, [USER, {"role": "system", "content": "late"}])
    assert error.param == "messages"
    assert "System message must be first" in str(error)


def test_arguments_as_dict_option_rejects_invalid_json(tiny_tokenizer) -> None:
    codec = ChatCodec(tiny_tokenizer, tool_call_arguments_as_dict=True)
    bad = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{nope"}}],
    }
    error = _error(codec.encode_prompt, [USER, bad])
    assert error.param == "messages[1].tool_calls[0].function.arguments"
