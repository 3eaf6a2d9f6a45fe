"""Exactness: the store holds exactly the ids the sampler consumed and produced, the text a client
sees is the decoding of those ids, and each turn's prompt extends the previous prompt + response."""

from __future__ import annotations

from typing import Any

import pytest
from proxy_helpers import MODEL, decode, stored_calls, strip_end_of_turn
from shared_helpers import new_id, one_id_per_byte, openai_client


@pytest.mark.parametrize(
    ("n", "stream"), [(1, False), (2, False), (1, True), (2, True)], ids=["n1", "n2", "n1-stream", "n2-stream"]
)
def test_store_holds_exactly_what_the_sampler_consumed_and_produced(proxy_server: Any, n: int, stream: bool) -> None:
    rid = new_id("exact")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"[{rid}] hello"}]
    with openai_client(proxy_server, rid) as client:
        kwargs = {
            "model": MODEL,
            "messages": messages,
            "max_tokens": 12,
            "n": n,
            "extra_body": {"return_token_ids": True},
        }
        if stream:
            chunks = list(client.chat.completions.create(stream=True, **kwargs))
            client_prompt = chunks[0].model_extra["prompt_token_ids"]
        else:
            response = client.chat.completions.create(**kwargs)
            client_prompt = response.model_extra["prompt_token_ids"]
    calls = stored_calls(proxy_server, rid)
    assert [c.choice_index for c in calls] == list(range(n))
    served = proxy_server.sampler.served_for(calls[0].prompt_token_ids)
    assert len(served) == 1, "the sampler served this prompt once"
    prompt, num_samples, _params, result = served[0]
    assert num_samples == n and len(result.sequences) == n
    assert result.prompt_tokens == prompt
    for call, sequence in zip(calls, result.sequences, strict=True):
        assert call.prompt_token_ids == prompt == client_prompt
        assert call.response_token_ids == sequence.tokens
        assert call.response_logprobs == sequence.logprobs
        assert call.token_policy_versions == sequence.token_policy_versions
        assert call.finish_reason == ("length" if sequence.stop_reason == "length" else "stop")


def test_first_prompt_is_the_chat_template_tokenization(proxy_server: Any, tiny_tokenizer: Any) -> None:
    rid = new_id("template")
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": f"[{rid}] Héllo, wörld ✓ — 你好?"},
        {"role": "assistant", "content": "A reply written by the agent itself."},
        {"role": "user", "content": "and now?"},
    ]
    with openai_client(proxy_server, rid) as client:
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    (call,) = stored_calls(proxy_server, rid)
    text = tiny_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert call.prompt_token_ids == tiny_tokenizer.encode(text, add_special_tokens=False)
    assert call.prefix_breaks == []


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_streamed_text_is_the_decoded_response_ids(proxy_server: Any, tiny_tokenizer: Any, seed: int) -> None:
    rid = new_id("decoded")
    with openai_client(proxy_server, rid) as client:
        chunks = list(
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"[{rid}]"}], max_tokens=32, seed=seed, stream=True
            )
        )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    (call,) = stored_calls(proxy_server, rid)
    assert streamed == decode(tiny_tokenizer, strip_end_of_turn(tiny_tokenizer, call.response_token_ids))


@pytest.mark.parametrize("text", ["Hé wörld ✓ 你好 🙂 done", "🙂"], ids=["multibyte", "one-emoji"])
def test_split_characters_stream_whole_and_end_of_turn_is_stripped(
    proxy_server: Any, tiny_tokenizer: Any, text: str
) -> None:
    """Multi-byte characters sampled one byte per token are streamed whole (never half a character),
    the <|im_end|> the sampler produced is kept in the ids but not in the text."""
    rid = new_id("bytes")
    im_end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = [*one_id_per_byte(tiny_tokenizer, text), im_end]
    proxy_server.sampler.script(rid, ids)
    with openai_client(proxy_server, rid) as client:
        chunks = list(
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"[{rid}]"}],
                stream=True,
                extra_body={"return_token_ids": True},
            )
        )
        whole = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"[{rid}]"}])
    choices = [c.choices[0] for c in chunks if c.choices]
    deltas = [c.delta.content or "" for c in choices]
    assert "".join(deltas) == text == whole.choices[0].message.content
    assert not any("\ufffd" in d for d in deltas)
    assert [t for c in choices for t in (c.model_extra or {}).get("token_ids", [])] == ids
    assert [c.finish_reason for c in choices if c.finish_reason] == ["stop"]
    for call in stored_calls(proxy_server, rid):
        assert call.response_token_ids == ids and call.response_text == text


def test_an_empty_reply_still_streams_its_token_ids(proxy_server: Any, tiny_tokenizer: Any) -> None:
    rid = new_id("empty")
    im_end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    proxy_server.sampler.script(rid, [im_end])
    with openai_client(proxy_server, rid) as client:
        chunks = list(
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"[{rid}]"}],
                stream=True,
                extra_body={"return_token_ids": True},
            )
        )
    (call,) = stored_calls(proxy_server, rid)
    assert call.response_token_ids == [im_end] and call.response_text == ""
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ""
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[0].model_extra.get("prompt_token_ids") == call.prompt_token_ids
    assert [t for c in chunks if c.choices for t in (c.choices[0].model_extra or {}).get("token_ids", [])] == [im_end]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_three_turn_conversation_extends_prompt_plus_response_exactly(
    proxy_server: Any, tiny_tokenizer: Any, stream: bool
) -> None:
    rid = new_id("turns")
    messages: list[dict[str, str]] = [{"role": "user", "content": f"[{rid}] first question"}]
    with openai_client(proxy_server, rid) as client:
        for turn in range(3):
            # Turn 0 stops by length (cut mid-word, maybe mid-character); turn 1 ends with <|im_end|>.
            if turn == 1:
                reply_ids = tiny_tokenizer.encode("Sure thing.<|im_end|>", add_special_tokens=False)
                proxy_server.sampler.script(f"[{rid}] second", reply_ids, times=1)
            kwargs = {"model": MODEL, "messages": messages, "max_tokens": 9, "seed": turn}
            if stream:
                reply = "".join(
                    c.choices[0].delta.content or ""
                    for c in client.chat.completions.create(stream=True, **kwargs)
                    if c.choices
                )
            else:
                reply = client.chat.completions.create(**kwargs).choices[0].message.content
            follow_up = ("second", "third", "fourth")[turn]
            messages += [
                {"role": "assistant", "content": reply},
                {"role": "user", "content": f"[{rid}] {follow_up} question"},
            ]
    calls = stored_calls(proxy_server, rid)
    assert len(calls) == 3
    assert calls[0].finish_reason == "length" and calls[1].finish_reason == "stop"
    for before, after in zip(calls, calls[1:], strict=False):
        prefix = before.prompt_token_ids + before.response_token_ids
        assert after.prompt_token_ids[: len(prefix)] == prefix
        assert after.prefix_breaks == []
    # Decoded, the last prompt is the template's text of the conversation it was built from.
    assert decode(tiny_tokenizer, calls[2].prompt_token_ids) == tiny_tokenizer.apply_chat_template(
        messages[:5], tokenize=False, add_generation_prompt=True
    )
