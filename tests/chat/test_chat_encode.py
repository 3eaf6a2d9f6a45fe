"""Prompt encoding without cache hits is exactly the chat template's tokenization."""

from __future__ import annotations

import pytest

from agl_bridge.chat import ChatCodec, TokenCache, normalize_messages

CONVERSATIONS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Why is the sky blue? ☀️"}],
    [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris, and 2+3?"},
        {
            "role": "assistant",
            "content": "On it.",
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {"id": "call_b", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "sunny, 21°C"},
        {"role": "tool", "tool_call_id": "call_b", "content": "5"},
        {"role": "assistant", "content": "Sunny and 21°C; 2+3=5."},
        {"role": "user", "content": [{"type": "text", "text": "thanks"}, {"type": "text", "text": "bye"}]},
    ],
]


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("use_tools", [False, True])
def test_encoding_equals_apply_chat_template(
    codec: ChatCodec, tiny_tokenizer, weather_tools, conversation, use_tools
) -> None:
    tools = weather_tools if use_tools else None
    encoding = codec.encode_prompt(conversation, tools)
    # The template sees the normalised messages (text parts joined), as the codec passes them.
    normalized = normalize_messages(conversation)
    expected_text = tiny_tokenizer.apply_chat_template(
        normalized, tools=tools, add_generation_prompt=True, tokenize=False
    )
    expected_ids = tiny_tokenizer.apply_chat_template(
        normalized, tools=tools, add_generation_prompt=True, tokenize=True
    )
    assert encoding.text == expected_text
    assert encoding.token_ids == list(expected_ids["input_ids"])
    assert encoding.text.endswith("<|im_start|>assistant\n")
    assert (encoding.reused, encoding.prefix_breaks) == ([], [])


def test_cache_without_matches_changes_nothing(codec: ChatCodec, tiny_tokenizer, tokens) -> None:
    cache = TokenCache(tiny_tokenizer)
    cache.remember(tokens.encode("something the agent never sends back") + [tokens.im_end])
    conversation = CONVERSATIONS[2]
    with_cache = codec.encode_prompt(conversation, token_cache=cache)
    assert with_cache.token_ids == codec.encode_prompt(conversation).token_ids
    # Assistant messages the agent wrote itself are not from this rollout: no break records.
    assert (with_cache.reused, with_cache.prefix_breaks) == ([], [])


def test_special_tokens_are_safe_cut_points(codec: ChatCodec, tokens, weather_tools) -> None:
    """Tokenizing the text between special/added tokens separately gives the same ids as the whole text.

    Cutting anywhere else does not (shown on the same text), so the check is not vacuous.
    """
    markers = [
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
    ]
    text = codec.encode_prompt(CONVERSATIONS[2], weather_tools).text + "<|endoftext|>x"
    cuts = sorted(
        {pos for m in markers for pos in _find_all(text, m)}
        | {pos + len(m) for m in markers for pos in _find_all(text, m)}
    )
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True) if b > a]
    assert len(pieces) > 20
    assert [t for p in pieces for t in tokens.encode(p)] == tokens.encode(text)

    word = text.index("Paris")
    assert tokens.encode(text[: word + 2]) + tokens.encode(text[word + 2 :]) != tokens.encode(text)


def _find_all(text: str, needle: str) -> list[int]:
    found, pos = [], text.find(needle)
    while pos >= 0:
        found.append(pos)
        pos = text.find(needle, pos + 1)
    return found
