"""The fewest tokens a text can be: never more than its real token count, so no prompt that fits is refused."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest
from tokenizers import normalizers, pre_tokenizers

from agl_bridge.chat import ChatCodec, PromptTooLongError, text_bound

_PIECES = [
    "word ",
    "tool output\n",
    "    ",
    "<|im_start|>",
    "</tool_response>",
    "\u1f00\u0313\u0300\u0345",  # composes under NFC (four code points become fewer)
    "\u1100\u1161\u11a8",  # Hangul jamo: three code points, one syllable after NFC
    "e\u0301",
    "日本語のテキスト",
    "🙂🙂",
    '{"a": [1, 2, 3]}',
    "0123456789" * 3,
    "=" * 40,
    " " * 60,
]


def _texts(count: int) -> list[str]:
    generator = random.Random(0)
    return ["".join(generator.choice(_PIECES) for _ in range(generator.randint(1, 400))) for _ in range(count)]


def test_the_tiny_tokenizer_is_byte_level_with_nfc(tiny_tokenizer: Any) -> None:
    bound = text_bound(tiny_tokenizer)
    assert bound.bytes_per_token == max(len(token) for token in tiny_tokenizer.get_vocab())
    assert bound.shrink == 4  # NFC can compose four code points into one
    assert bound.chars_per_token == 4 * bound.bytes_per_token


@pytest.mark.parametrize("normalized", [True, False], ids=["nfc", "no_normalizer"])
def test_the_bound_never_exceeds_the_real_token_count(tiny_tokenizer: Any, normalized: bool) -> None:
    tokenizer = copy.deepcopy(tiny_tokenizer)
    if not normalized:
        tokenizer.backend_tokenizer.normalizer = None
    bound = text_bound(tokenizer)
    assert bound.shrink == (4 if normalized else 1)
    for text in _texts(150):
        assert bound.min_tokens(text) <= len(tokenizer.encode(text, add_special_tokens=False)), text
    longest = max(tokenizer.get_vocab(), key=len)
    text = tokenizer.convert_tokens_to_string([longest]) * 100
    assert bound.min_tokens(text) == len(tokenizer.encode(text, add_special_tokens=False)) == 100  # tight here


def test_tokenizers_without_the_guarantee_get_no_bound(tiny_tokenizer: Any) -> None:
    dropping = copy.deepcopy(tiny_tokenizer)
    dropping.backend_tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()  # whitespace belongs to no token
    replacing = copy.deepcopy(tiny_tokenizer)
    replacing.backend_tokenizer.normalizer = normalizers.Replace("  ", " ")
    for tokenizer in (dropping, replacing, object()):
        bound = text_bound(tokenizer)
        assert bound.bytes_per_token is None and bound.min_tokens("x" * 10**6) == 0


def test_a_prompt_that_cannot_fit_is_refused_before_tokenizing(tiny_tokenizer: Any) -> None:
    codec = ChatCodec(tiny_tokenizer)
    messages = [{"role": "user", "content": "word " * 20_000}]
    with pytest.raises(PromptTooLongError) as refused:
        codec.encode_normalized(messages, None, max_tokens=1000)
    assert refused.value.param == "messages" and refused.value.min_tokens > 1000
    assert "at most 1000 fit" in str(refused.value)
    fits = [{"role": "user", "content": "word " * 100}]
    assert codec.encode_normalized(fits, None, max_tokens=1000).token_ids == codec.encode_prompt(fits).token_ids
