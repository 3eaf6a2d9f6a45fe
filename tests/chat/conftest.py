"""Fixtures for the chat tests: a codec on the tiny tokenizer, template variants, and sampled-looking ids."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from typing import Any

import pytest
from shared_helpers import byte_level_alphabet, one_id_per_byte

from agl_bridge.chat import ChatCodec, TokenCache


class TokenTools:
    """Helpers that build sampled-looking token id sequences for the tiny byte-level tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.byte_to_char = byte_level_alphabet()
        self.char_to_byte = {c: b for b, c in self.byte_to_char.items()}
        self.added_ids = set(tokenizer.get_added_vocab().values())
        self.im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.endoftext = tokenizer.convert_tokens_to_ids("<|endoftext|>")
        self.plain_ids = [i for i in range(len(tokenizer)) if i not in self.added_ids]

    def encode(self, text: str) -> list[int]:
        """Canonical ids of `text`."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`, special tokens kept."""
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def byte_ids(self, text: str) -> list[int]:
        """One id per UTF-8 byte of `text` (the least merged spelling a sampler can produce)."""
        return one_id_per_byte(self.tokenizer, text)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a (non-added) token stands for."""
        return bytes(self.char_to_byte[c] for c in self.tokenizer.convert_ids_to_tokens(token_id))

    def reencodes_differently(self, ids: list[int]) -> bool:
        """True when encode(decode(ids)) != ids: re-tokenizing the text would lose the sampled ids."""
        return self.encode(self.decode(ids)) != ids

    def noncanonical(self, text: str, rng: random.Random, split_probability: float = 0.5) -> list[int]:
        """Ids that decode to `text` but are not its canonical tokenization (multi-byte tokens split).

        Added tokens (<tool_call>, ...) stay single ids, as a model samples them. At least one
        token is always split, and the result is checked to re-encode differently.
        """
        canonical = self.encode(text)
        splittable = [k for k, t in enumerate(canonical) if t not in self.added_ids and len(self.token_bytes(t)) > 1]
        assert splittable, f"{text!r} has no multi-byte token to split"
        forced = rng.choice(splittable)
        out: list[int] = []
        for k, token_id in enumerate(canonical):
            if k in splittable and (k == forced or rng.random() < split_probability):
                raw = self.token_bytes(token_id)
                cut = rng.randrange(1, len(raw))
                # Two shorter pieces when both exist in the vocabulary, else single bytes.
                left, right = (self._vocab_id(raw[:cut]), self._vocab_id(raw[cut:]))
                if left is not None and right is not None:
                    out += [left, right]
                else:
                    out += [self._vocab_id(bytes([b])) for b in raw]
            else:
                out.append(token_id)
        assert self.decode(out) == self.decode(canonical)
        assert self.reencodes_differently(out), f"splitting {text!r} still re-encodes to the same ids"
        return out

    def random_ids(self, rng: random.Random, length: int) -> list[int]:
        """Uniformly random non-added ids (what an untrained model samples); may decode to broken UTF-8."""
        return [rng.choice(self.plain_ids) for _ in range(length)]

    def _vocab_id(self, raw: bytes) -> int | None:
        token = "".join(self.byte_to_char[b] for b in raw)
        token_id = self.tokenizer.convert_tokens_to_ids(token)
        return token_id if isinstance(token_id, int) and token_id not in self.added_ids and token_id >= 0 else None


@pytest.fixture(scope="session")
def codec(tiny_tokenizer: Any) -> ChatCodec:
    """ChatCodec over the tiny tokenizer and its shipped ChatML template."""
    return ChatCodec(tiny_tokenizer)


@pytest.fixture(scope="session")
def tokens(tiny_tokenizer: Any) -> TokenTools:
    """Sampled-looking id builders for the tiny tokenizer."""
    return TokenTools(tiny_tokenizer)


@pytest.fixture()
def cache(tiny_tokenizer: Any) -> TokenCache:
    """An empty per-rollout token cache."""
    return TokenCache(tiny_tokenizer)


@pytest.fixture(scope="session")
def with_template(tiny_tokenizer: Any) -> Callable[[str], Any]:
    """Copies of the tiny tokenizer with another chat template (the shared one is left untouched)."""

    def make(template: str) -> Any:
        variant = copy.deepcopy(tiny_tokenizer)
        variant.chat_template = template
        return variant

    return make


_WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
        },
    },
]


@pytest.fixture()
def weather_tools() -> list[dict[str, Any]]:
    """Two OpenAI function tools."""
    return copy.deepcopy(_WEATHER_TOOLS)
