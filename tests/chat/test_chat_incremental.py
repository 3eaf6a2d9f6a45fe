"""IncrementalDecoder: streamed deltas never carry half a character and add up to the full decode."""

from __future__ import annotations

import random

import pytest

from agl_bridge.chat import ChatCodec, IncrementalDecoder


def _stream(decoder: IncrementalDecoder, ids: list[int], full_decode) -> list[str]:
    """Feed ids one by one, checking after each that what was released is final text."""
    deltas = []
    for token_id in ids:
        delta = decoder.push(token_id)
        # A possibly incomplete character (shown as U+FFFD) is held back until more bytes decide it.
        assert not delta.endswith("\ufffd")
        deltas.append(delta)
        released = "".join(deltas)
        # Everything released so far is a prefix of the final text: nothing is ever taken back.
        assert full_decode(ids).startswith(released)
    deltas.append(decoder.finish())
    return deltas


def test_multibyte_character_split_over_tokens(codec: ChatCodec, tokens) -> None:
    decoder = codec.incremental_decoder()
    ids = tokens.byte_ids("a€b")  # € is 3 bytes, so 3 ids
    assert [decoder.push(t) for t in ids] == ["a", "", "", "€", "b"]
    assert decoder.finish() == ""
    assert decoder.text == "a€b"
    assert decoder.token_ids == ids


def test_truncated_character_is_flushed_by_finish(codec: ChatCodec, tokens, tiny_tokenizer) -> None:
    decoder = codec.incremental_decoder()
    ids = tokens.byte_ids("ok 🙂")[:-2]  # 2 of the emoji's 4 bytes
    assert decoder.extend(ids) == "ok "
    rest = decoder.finish()
    assert rest.startswith("\ufffd")
    assert decoder.text == tiny_tokenizer.decode(ids)


@pytest.mark.parametrize("seed", range(30))
def test_random_ids_join_to_the_full_decode(tiny_tokenizer, tokens, seed: int) -> None:
    rng = random.Random(seed)
    # Mix arbitrary ids with byte tokens of multi-byte characters, some cut short.
    ids: list[int] = []
    while len(ids) < 60:
        choice = rng.random()
        if choice < 0.4:
            ids += tokens.random_ids(rng, rng.randint(1, 5))
        elif choice < 0.8:
            piece = tokens.byte_ids(rng.choice(["é", "日本", "🙂", "€", "Ω"]))
            ids += piece[: rng.randint(1, len(piece))]
        else:
            ids.append(
                rng.choice([tokens.im_end, tokens.im_end - 1, tiny_tokenizer.convert_tokens_to_ids("<tool_call>")])
            )
    skip = seed % 2 == 1

    def full_decode(some: list[int]) -> str:
        return tiny_tokenizer.decode(some, skip_special_tokens=skip)

    deltas = _stream(IncrementalDecoder(tiny_tokenizer, skip_special_tokens=skip), ids, full_decode)
    assert "".join(deltas) == full_decode(ids)
    # Deltas are released incrementally, not all at the end.
    assert sum(1 for d in deltas[:-1] if d) > 10


def test_partial_utf8_actually_occurs(tiny_tokenizer, tokens) -> None:
    """The random streams above do contain held-back incomplete characters (the case under test)."""
    rng = random.Random(0)
    decoder = IncrementalDecoder(tiny_tokenizer)
    held = 0
    for token_id in tokens.byte_ids("日本語 and 🙂") + tokens.random_ids(rng, 40):
        before = decoder.text
        if decoder.push(token_id) == "" and tiny_tokenizer.decode(decoder.token_ids) != before:
            held += 1
    assert held >= 4
