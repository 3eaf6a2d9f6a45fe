"""The property training relies on: within one rollout, prompt_{k+1} extends prompt_k + response_k exactly.

Responses are built the way a sampler produces them (not the canonical tokenization of their
text), so `encode(decode(response)) != response` in most cases; the tests assert that they are,
and that naive re-tokenization would indeed break the property.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from agl_bridge.chat import ChatCodec, TokenCache

WORDS = ["the", "weather", "is", "sunny", "café", "naïve", "日本語", "🙂", "42", "Hello", "world", ",",
         "résumé", "straße", "JSON", "  spaced", "tab\there", "line\nbreak", "don't", "3.14", "Ωmega"]  # fmt: skip


def _sentence(rng: random.Random) -> str:
    # Starts with a word of several bytes, so there is always a token to split.
    return " ".join(
        [rng.choice(["Hello", "Sure", "The weather", "Well"])] + [rng.choice(WORDS) for _ in range(rng.randint(1, 7))]
    )


def _roundtrip(message: dict[str, Any]) -> dict[str, Any]:
    """What an agent sends back: the assistant message after a trip through JSON (HTTP)."""
    return json.loads(json.dumps(message))


def _sample(kind: str, tokens, rng: random.Random) -> tuple[list[int], str]:
    """A sampled-looking response of the given kind: (ids, stop_reason)."""
    if kind == "text":
        return tokens.noncanonical(_sentence(rng), rng) + [tokens.im_end], "stop"
    if kind == "tool":
        blocks = []
        for _ in range(rng.randint(1, 2)):
            if rng.random() < 0.5:
                call = {"name": "get_weather", "arguments": {"city": rng.choice(["Paris", "Zürich", "東京"])}}
            else:
                call = {"name": "add", "arguments": {"a": rng.randint(0, 99), "b": rng.randint(0, 99) / 4}}
            blocks.append(f"<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n</tool_call>")
        content = _sentence(rng) + "\n" if rng.random() < 0.6 else ""
        return tokens.noncanonical(content + "\n".join(blocks), rng) + [tokens.im_end], "stop"
    if kind == "length":
        ids = tokens.noncanonical(_sentence(rng), rng)
        return ids[: rng.randint(1, len(ids))], "length"
    assert kind == "random"
    ids = tokens.random_ids(rng, rng.randint(1, 24))
    return (ids + [tokens.im_end], "stop") if rng.random() < 0.7 else (ids, "length")


def _agent_turn(messages: list[dict[str, Any]], assistant: dict[str, Any], rng: random.Random) -> None:
    """Append the assistant message as sent back, then tool results or a new user message."""
    messages.append(_roundtrip(assistant))
    for call in assistant.get("tool_calls") or []:
        messages.append(
            {"role": "tool", "tool_call_id": call["id"], "content": f"result of {call['function']['name']}"}
        )
    if not assistant.get("tool_calls"):
        messages.append({"role": "user", "content": _sentence(rng)})


def _assert_extends(encoding, prompt: list[int], response: list[int]) -> None:
    head = encoding.token_ids[: len(prompt) + len(response)]
    assert head == prompt + response, "next prompt does not extend previous prompt + response"


@pytest.mark.parametrize("seed", range(24))
def test_multi_turn_rollout_extends_exactly(codec: ChatCodec, tiny_tokenizer, tokens, weather_tools, seed: int) -> None:
    rng = random.Random(seed)
    cache = TokenCache(tiny_tokenizer)
    tools = weather_tools if seed % 3 else None
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be helpful."},
        {"role": "user", "content": _sentence(rng)},
    ]
    mismatches = naive_breaks = 0
    turns = 5
    for _ in range(turns):
        encoding = codec.encode_prompt(messages, tools, token_cache=cache)
        kind = rng.choice(["text", "tool", "tool", "length", "random"])
        response, stop_reason = _sample(kind, tokens, rng)
        cache.remember(response, prompt_token_ids=encoding.token_ids)
        _agent_turn(messages, codec.decode_response(response, stop_reason).to_openai(), rng)

        following = codec.encode_prompt(messages, tools, token_cache=cache)
        _assert_extends(following, encoding.token_ids, response)
        assert following.prefix_breaks == []
        assistant_indices = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        assert [span.message_index for span in following.reused] == assistant_indices
        last = following.reused[-1]
        assert (last.token_start, last.num_tokens) == (len(encoding.token_ids), len(response))

        if tokens.reencodes_differently(response):
            mismatches += 1
            naive = codec.encode_prompt(messages, tools).token_ids
            naive_breaks += naive[: len(encoding.token_ids) + len(response)] != encoding.token_ids + response
    # Not vacuous: most responses re-encode differently, and then plain re-tokenization breaks the property.
    assert mismatches >= turns - 2
    assert naive_breaks == mismatches


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_ids_extend_exactly(codec: ChatCodec, tiny_tokenizer, tokens, data) -> None:
    """Any id sequence an untrained model can sample, broken UTF-8 included, maps back exactly."""
    response = data.draw(st.lists(st.sampled_from(tokens.plain_ids), min_size=2, max_size=30), label="response")
    stopped = data.draw(st.booleans(), label="stopped")
    if stopped:
        response = response + [tokens.im_end]
    # Only the cases naive re-tokenization gets wrong (nearly all random sequences).
    assume(tokens.reencodes_differently(response))
    cache = TokenCache(tiny_tokenizer)
    messages = [{"role": "user", "content": "go"}]
    prompt = codec.encode_prompt(messages, token_cache=cache).token_ids
    cache.remember(response, prompt_token_ids=prompt)
    assistant = codec.decode_response(response, "stop" if stopped else "length").to_openai()
    messages += [_roundtrip(assistant), {"role": "user", "content": "again"}]
    following = codec.encode_prompt(messages, token_cache=cache)
    _assert_extends(following, prompt, response)
    assert following.prefix_breaks == []


def test_length_stop_inside_a_multibyte_character(codec: ChatCodec, tiny_tokenizer, tokens) -> None:
    response = tokens.byte_ids("Hi 日本")[:-1]  # the last character is cut after 2 of its 3 bytes
    assert tokens.decode(response).endswith("\ufffd")
    assert tokens.reencodes_differently(response)
    cache = TokenCache(tiny_tokenizer)
    messages = [{"role": "user", "content": "go"}]
    prompt = codec.encode_prompt(messages, token_cache=cache).token_ids
    cache.remember(response)
    messages += [_roundtrip(codec.decode_response(response, "length").to_openai()), {"role": "user", "content": "more"}]
    following = codec.encode_prompt(messages, token_cache=cache)
    _assert_extends(following, prompt, response)
    # The template's end-of-turn marker follows the sampled ids, as text.
    assert following.token_ids[len(prompt) + len(response)] == tokens.im_end


def test_tool_call_roundtrip_uses_sampled_ids(codec: ChatCodec, tiny_tokenizer, tokens, weather_tools) -> None:
    rng = random.Random(7)
    text = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>'
    response = tokens.noncanonical(text, rng, split_probability=1.0) + [tokens.im_end]
    cache = TokenCache(tiny_tokenizer)
    messages = [{"role": "user", "content": "Weather in Zürich?"}]
    prompt = codec.encode_prompt(messages, weather_tools, token_cache=cache).token_ids
    cache.remember(response, prompt_token_ids=prompt)
    assistant = codec.decode_response(response, "stop")
    assert assistant.finish_reason == "tool_calls"
    call = assistant.tool_calls[0]
    messages += [_roundtrip(assistant.to_openai()), {"role": "tool", "tool_call_id": call.id, "content": "4°C"}]
    following = codec.encode_prompt(messages, weather_tools, token_cache=cache)
    _assert_extends(following, prompt, response)
    assert following.token_ids[len(prompt) : len(prompt) + len(response)] == response
    assert following.prefix_breaks == []


def test_reformatted_tool_json_is_reported(codec: ChatCodec, tiny_tokenizer, tokens) -> None:
    """Compact JSON from the model re-renders with ", "/": " separators: a break, not a silent change."""
    response = tokens.encode('<tool_call>\n{"name":"add","arguments":{"a":1,"b":2}}\n</tool_call>') + [tokens.im_end]
    cache = TokenCache(tiny_tokenizer)
    messages = [{"role": "user", "content": "1+2?"}]
    prompt = codec.encode_prompt(messages, token_cache=cache).token_ids
    cache.remember(response)
    assistant = codec.decode_response(response, "stop").to_openai()
    messages += [
        _roundtrip(assistant),
        {"role": "tool", "tool_call_id": assistant["tool_calls"][0]["id"], "content": "3"},
    ]
    following = codec.encode_prompt(messages, token_cache=cache)
    assert following.token_ids[: len(prompt) + len(response)] != prompt + response
    assert [(b.message_index, b.kind) for b in following.prefix_breaks] == [(1, "rendered_differently")]
    assert '"name":"add"' in following.prefix_breaks[0].reason and '"name": "add"' in following.prefix_breaks[0].reason
    assert following.reused == []
    assert following.token_ids == codec.encode_prompt(messages).token_ids


def test_other_stop_token_is_kept_so_the_next_prompt_extends(codec: ChatCodec, tiny_tokenizer, tokens) -> None:
    """A turn ended by <|endoftext|>: every sampled id is kept, the template's <|im_end|> follows, no break."""
    rng = random.Random(3)
    response = tokens.noncanonical("Done, café closed.", rng) + [tokens.endoftext]
    cache = TokenCache(tiny_tokenizer)
    messages = [{"role": "user", "content": "status?"}]
    prompt = codec.encode_prompt(messages, token_cache=cache).token_ids
    cache.remember(response)
    messages += [_roundtrip(codec.decode_response(response, "stop").to_openai()), {"role": "user", "content": "ok"}]
    following = codec.encode_prompt(messages, token_cache=cache)
    assert following.token_ids[: len(prompt) + len(response)] == prompt + response
    assert following.token_ids[len(prompt) + len(response)] == tokens.im_end
    assert following.prefix_breaks == []
    assert following.reused[0].num_tokens == len(response)


def test_same_text_different_ids_picks_the_response_to_this_prompt(codec: ChatCodec, tiny_tokenizer, tokens) -> None:
    rng = random.Random(11)
    text = "The answer is 42, naïvely."
    first = tokens.noncanonical(text, rng) + [tokens.im_end]
    second = tokens.noncanonical(text, rng) + [tokens.im_end]
    while second == first:
        second = tokens.noncanonical(text, rng) + [tokens.im_end]
    cache = TokenCache(tiny_tokenizer)
    messages = [{"role": "user", "content": "question"}]
    prompt = codec.encode_prompt(messages, token_cache=cache).token_ids
    # `first` answered some other prompt of this rollout (e.g. a retried branch), and is more recent.
    cache.remember(second, prompt_token_ids=prompt)
    cache.remember(first, prompt_token_ids=prompt + [5])
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "next"}]
    following = codec.encode_prompt(messages, token_cache=cache)
    _assert_extends(following, prompt, second)

    # Without prompts to tell them apart, the most recently remembered response wins.
    unkeyed = TokenCache(tiny_tokenizer)
    unkeyed.remember(first)
    unkeyed.remember(second)
    _assert_extends(codec.encode_prompt(messages, token_cache=unkeyed), prompt, second)


def test_agent_edits_are_not_prefix_breaks_unless_it_is_our_reply(codec: ChatCodec, tiny_tokenizer, tokens) -> None:
    response = tokens.byte_ids("Sure, here it is.") + [tokens.im_end]
    cache = TokenCache(tiny_tokenizer)
    cache.remember(response)
    base = [{"role": "user", "content": "q"}]
    rewritten = codec.encode_prompt(
        base + [{"role": "assistant", "content": "Something else."}, {"role": "user", "content": "x"}],
        token_cache=cache,
    )
    assert (rewritten.reused, rewritten.prefix_breaks) == ([], [])
    # Only whitespace differs: it is our reply, changed on the way, so the break is reported.
    trimmed = codec.encode_prompt(
        base + [{"role": "assistant", "content": " Sure, here it is. "}, {"role": "user", "content": "x"}],
        token_cache=cache,
    )
    assert [(b.message_index, b.kind) for b in trimmed.prefix_breaks] == [(1, "rendered_differently")]


# A condensed Qwen3 template: assistant turns before the last user query lose their <think> block.
QWEN3_STYLE = """
{%- set ns = namespace(last_query_index=-1) %}
{%- for message in messages %}
    {%- if message.role == 'user' %}{%- set ns.last_query_index = loop.index0 %}{%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role == 'user' or message.role == 'system' %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set content = message.content or '' %}
        {%- set reasoning_content = '' %}
        {%- if '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and reasoning_content %}
            {{- '<|im_start|>assistant\\n<think>\\n' + reasoning_content.strip('\\n')
                + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
        {%- else %}
            {{- '<|im_start|>assistant\\n' + content }}
        {%- endif %}
        {%- for tool_call in (message.tool_calls or []) %}
            {%- if content or not loop.first %}{{- '\\n' }}{%- endif %}
            {{- '<tool_call>\\n{"name": "' + tool_call.function.name + '", "arguments": '
                + tool_call.function.arguments + '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""


def test_qwen3_style_think_stripping_is_a_reported_break(with_template, tokens) -> None:
    tokenizer = with_template(QWEN3_STYLE)
    codec = ChatCodec(tokenizer)
    cache = TokenCache(tokenizer)
    rng = random.Random(5)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Add 2 and 3."}]

    # Turn 1: think + tool call; the tool loop keeps the <think> block, so the prompt extends exactly.
    text = (
        '<think>\nI should add.\n</think>\n\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    )
    first = tokens.noncanonical(text, rng) + [tokens.im_end]
    prompt1 = codec.encode_prompt(messages, token_cache=cache).token_ids
    cache.remember(first, prompt_token_ids=prompt1)
    assistant = codec.decode_response(first, "stop").to_openai()
    messages += [
        _roundtrip(assistant),
        {"role": "tool", "tool_call_id": assistant["tool_calls"][0]["id"], "content": "5"},
    ]
    encoding2 = codec.encode_prompt(messages, token_cache=cache)
    _assert_extends(encoding2, prompt1, first)
    assert encoding2.prefix_breaks == []

    # Turn 2: final answer, then a new user query: the template now drops both <think> blocks.
    second = tokens.noncanonical("<think>\nIt is 5.\n</think>\n\nThe sum is 5.", rng) + [tokens.im_end]
    cache.remember(second, prompt_token_ids=encoding2.token_ids)
    messages += [_roundtrip(codec.decode_response(second, "stop").to_openai()), {"role": "user", "content": "Thanks!"}]
    encoding3 = codec.encode_prompt(messages, token_cache=cache)
    assert "<think>" not in encoding3.text
    # Message 1 itself renders without its <think>; message 3's prompt (which showed message 1
    # with <think>) is no longer a prefix of the conversation.
    assert [(b.message_index, b.kind) for b in encoding3.prefix_breaks] == [
        (1, "rendered_differently"),
        (3, "not_prefix_stable"),
    ]
    assert "<think>" in encoding3.prefix_breaks[0].reason
    assert "I should add" in encoding3.prefix_breaks[1].reason
    assert encoding3.reused == []
    assert (
        encoding3.token_ids
        == tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
    )
    assert encoding3.token_ids[: len(encoding2.token_ids)] != encoding2.token_ids


def test_whitespace_trimming_template_is_a_reported_break(with_template, tokens) -> None:
    trimming = (
        "{%- for m in messages %}"
        "{{ '<|im_start|>' + m.role + '\\n' + (m.content | trim) + '<|im_end|>\\n' }}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    tokenizer = with_template(trimming)
    codec = ChatCodec(tokenizer)
    cache = TokenCache(tokenizer)
    messages = [{"role": "user", "content": "hello"}]
    prompt = codec.encode_prompt(messages, token_cache=cache).token_ids
    kept = tokens.encode("Hi there.") + [tokens.im_end]
    padded = tokens.encode("  Hi again.\n") + [tokens.im_end]
    cache.remember(kept, prompt_token_ids=prompt)
    messages += [_roundtrip(codec.decode_response(kept, "stop").to_openai()), {"role": "user", "content": "and?"}]
    prompt2 = codec.encode_prompt(messages, token_cache=cache)
    _assert_extends(prompt2, prompt, kept)
    cache.remember(padded, prompt_token_ids=prompt2.token_ids)
    messages += [_roundtrip(codec.decode_response(padded, "stop").to_openai()), {"role": "user", "content": "ok"}]
    prompt3 = codec.encode_prompt(messages, token_cache=cache)
    assert [s.message_index for s in prompt3.reused] == [1]
    assert [(b.message_index, b.kind) for b in prompt3.prefix_breaks] == [(3, "rendered_differently")]


def test_prefix_unstable_template_is_a_reported_break(with_template, tokens) -> None:
    counting = (
        "{{ '<|im_start|>system\\n' + (messages | length | string) + ' messages<|im_end|>\\n' }}"
        "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    tokenizer = with_template(counting)
    codec = ChatCodec(tokenizer)
    cache = TokenCache(tokenizer)
    messages = [{"role": "user", "content": "hello"}]
    response = tokens.encode("Hi.") + [tokens.im_end]
    cache.remember(response, prompt_token_ids=codec.encode_prompt(messages).token_ids)
    messages += [_roundtrip(codec.decode_response(response, "stop").to_openai()), {"role": "user", "content": "x"}]
    encoding = codec.encode_prompt(messages, token_cache=cache)
    assert [(b.message_index, b.kind) for b in encoding.prefix_breaks] == [(1, "not_prefix_stable")]
    assert "1 messages" in encoding.prefix_breaks[0].reason and "3 messages" in encoding.prefix_breaks[0].reason


def test_arguments_as_dict_mode_extends_exactly(tiny_tokenizer, tokens, weather_tools) -> None:
    """Templates fed parsed arguments (vLLM's behaviour for Llama-style templates) re-render them identically."""
    codec = ChatCodec(tiny_tokenizer, tool_call_arguments_as_dict=True)
    rng = random.Random(2)
    text = '<tool_call>\n{"name": "add", "arguments": {"b": 2, "a": "ünï"}}\n</tool_call>'
    response = tokens.noncanonical(text, rng) + [tokens.im_end]
    cache = TokenCache(tiny_tokenizer)
    messages = [{"role": "user", "content": "add"}]
    prompt = codec.encode_prompt(messages, weather_tools, token_cache=cache).token_ids
    cache.remember(response, prompt_token_ids=prompt)
    assistant = codec.decode_response(response, "stop").to_openai()
    messages += [
        _roundtrip(assistant),
        {"role": "tool", "tool_call_id": assistant["tool_calls"][0]["id"], "content": "x"},
    ]
    following = codec.encode_prompt(messages, weather_tools, token_cache=cache)
    _assert_extends(following, prompt, response)
    assert following.prefix_breaks == []
