"""The supervised warm start's datums: the chat-templated prompt masked, the response trained."""

from __future__ import annotations

import json
import math
import re

import pytest

from agl_bridge.train.warm_start import sft_datum


def test_sft_datum_trains_only_the_response(tiny_tokenizer) -> None:
    from agl_bridge.chat import ChatCodec

    codec = ChatCodec(tiny_tokenizer)
    datum = sft_datum(codec, "Say you are 7.", "I'm 7.")
    weights = datum.loss_fn_inputs["weights"]
    trained = [t for t, w in zip(datum.loss_fn_inputs["target_tokens"], weights, strict=False) if w]
    assert tiny_tokenizer.decode(trained) == "I'm 7.<|im_end|>"
    assert not math.isnan(sum(weights))


ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "type": "object"},
    },
}


def _prompt_ids(datum) -> list[int]:
    """The datum's masked prefix: the prompt ids (the first target is the second token)."""
    weights = datum.loss_fn_inputs["weights"]
    first_trained = next(i for i, w in enumerate(weights) if w)
    return datum.model_input[: first_trained + 1]


def test_a_prompt_with_tools_is_rendered_with_them_as_the_agents_request_is(tiny_tokenizer) -> None:
    from agl_bridge.chat import ChatCodec

    codec = ChatCodec(tiny_tokenizer)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}]
    response = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    datum = sft_datum(codec, {"messages": messages, "tools": [ADD_TOOL]}, response)
    assert _prompt_ids(datum) == codec.encode_prompt(messages, [ADD_TOOL]).token_ids
    assert "<tools>" in tiny_tokenizer.decode(_prompt_ids(datum))
    weights = datum.loss_fn_inputs["weights"]
    trained = [t for t, w in zip(datum.loss_fn_inputs["target_tokens"], weights, strict=True) if w]
    assert tiny_tokenizer.decode(trained) == response + "<|im_end|>"
    # Without tools (the key left out, or a plain list of messages), the same messages render without them.
    for prompt in ({"messages": messages}, messages, tuple(messages)):
        assert _prompt_ids(sft_datum(codec, prompt, "5")) == codec.encode_prompt(messages).token_ids


def test_prompt_parts_reads_every_prompt_form_and_refuses_others() -> None:
    from agl_bridge.train.warm_start import prompt_parts

    user = [{"role": "user", "content": "hi"}]
    assert prompt_parts("hi") == (user, None)
    assert prompt_parts(user) == (user, None)
    assert prompt_parts({"messages": user, "tools": [ADD_TOOL]}) == (user, [ADD_TOOL])
    for bad, says in (
        ({"messages": user, "tool": []}, "unknown keys ['tool']"),
        ({"tools": []}, '{"messages": [...]'),
        ({"messages": user, "tools": {"add": ADD_TOOL}}, '"tools" must be a list'),
        (7, "got int"),
    ):
        with pytest.raises(ValueError, match=re.escape(says)):
            prompt_parts(bad)


def test_load_pairs_takes_prompts_with_tools_and_names_a_bad_record(tmp_path) -> None:
    from agl_bridge.errors import ConfigError
    from agl_bridge.train.warm_start import load_pairs

    user = [{"role": "user", "content": "What is 2 + 3?"}]
    good = tmp_path / "sft.jsonl"
    records = [
        {"prompt": "Say you are 7.", "response": "I'm 7."},
        {"prompt": {"messages": user, "tools": [ADD_TOOL]}, "response": "5"},
    ]
    good.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert load_pairs(str(good)) == [("Say you are 7.", "I'm 7."), ({"messages": user, "tools": [ADD_TOOL]}, "5")]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(records[0]) + "\n" + json.dumps({"prompt": {"message": user}, "response": "5"}) + "\n")
    with pytest.raises(ConfigError, match=r"bad\.jsonl, record 2: .*unknown keys \['message'\]"):
        load_pairs(str(bad))


def _conversation_pairs(codec) -> list[tuple[object, str]]:
    """A two-turn tool conversation's warm-start pairs (each prompt continues the one before), then an
    unrelated one-turn pair."""
    user = [{"role": "user", "content": "What is 2 + 3?"}]
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    follow = [
        *user,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
    ]
    return [
        ({"messages": user, "tools": [ADD_TOOL]}, call),
        ({"messages": follow, "tools": [ADD_TOOL]}, "It is 5."),
        ("Say hi.", "Hi."),
    ]


def test_merge_turns_trains_a_conversation_as_one_example_with_every_response(tiny_tokenizer) -> None:
    from agl_bridge.chat import ChatCodec
    from agl_bridge.train.warm_start import merged_conversations, sft_tokens

    codec = ChatCodec(tiny_tokenizer)
    pairs = _conversation_pairs(codec)
    separate = [sft_tokens(codec, prompt, response) for prompt, response in pairs]
    merged = merged_conversations(codec, pairs)
    assert len(merged) == 2  # the two turns of the conversation, then the unrelated pair
    (tokens, weights), last = merged
    assert last == separate[2]
    # The merged example is the second turn's whole sequence, with the first response trained in it too.
    assert tokens == separate[1][0]
    trained = tiny_tokenizer.decode([t for t, w in zip(tokens, weights, strict=True) if w])
    assert trained == pairs[0][1] + "<|im_end|>" + "It is 5.<|im_end|>"
    # Only the responses are trained: the tool result and the template's tokens between them are not.
    assert sum(weights) == sum(separate[0][1]) + sum(separate[1][1])


def test_merge_turns_keeps_turns_apart_when_a_prompt_does_not_continue_the_last(tiny_tokenizer) -> None:
    from agl_bridge.chat import ChatCodec
    from agl_bridge.train.warm_start import merged_conversations

    codec = ChatCodec(tiny_tokenizer)
    first, second, _ = _conversation_pairs(codec)
    # The second turn with another first reply in its history: its prompt no longer extends the first turn.
    other = {**second[0], "messages": [*second[0]["messages"][:1], {"role": "assistant", "content": "Let me see."}]}
    assert len(merged_conversations(codec, [first, (other, "It is 5.")])) == 2
