"""How few tokens a text can be: a bound read off the tokenizer, for refusing a prompt too long to fit
before paying for its tokenization.

For a byte-level BPE (Qwen, Llama 3, GPT-2 style) every byte of the (normalised) input belongs to
exactly one token, and no token spans more bytes than its longest vocabulary entry, so a text of N
characters has at least N / (longest entry) tokens — each character being at least one byte.
Unicode normalisation can shorten a text first: NFC/NFKC compose at most four code points into
one (e.g. U+1F82 from α + three marks), so with such a normaliser the bound divides by four more —
except for ASCII text, which no Unicode normalisation changes (and `str.isascii` costs nothing).
Tokenizers without these guarantees (a pre-tokenizer that drops whitespace, a normaliser that
replaces or strips text, a slow Python tokenizer) get no bound, and nothing is refused early.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

_UNICODE_NORMALIZERS = frozenset({"NFC", "NFKC", "NFD", "NFKD"})
_MAX_CODE_POINTS_COMPOSED = 4
_COVERING_PRE_TOKENIZERS = frozenset({"ByteLevel", "Split", "Digits", "Punctuation"})


@dataclass(frozen=True)
class TextBound:
    """`bytes_per_token`: the longest vocabulary entry in bytes (None: no bound known); `shrink`: how many
    code points the normaliser can compose into one."""

    bytes_per_token: int | None
    shrink: int = 1

    def min_tokens(self, text: str) -> int:
        """The fewest tokens `text` can be (0 when no bound is known)."""
        if self.bytes_per_token is None:
            return 0
        shrink = 1 if text.isascii() else self.shrink
        return math.ceil(len(text) / (self.bytes_per_token * shrink))

    @property
    def chars_per_token(self) -> int | None:
        """The most characters of any text one token can stand for (None: no bound known)."""
        return None if self.bytes_per_token is None else self.bytes_per_token * self.shrink


def text_bound(tokenizer: Any) -> TextBound:
    """The bound for `tokenizer` (a transformers fast tokenizer); `TextBound(None)` where none holds."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return TextBound(None)
    try:
        spec = json.loads(backend.to_str())
        vocab = tokenizer.get_vocab()
    except (AttributeError, TypeError, ValueError):
        return TextBound(None)
    factor = _normalizer_factor(spec.get("normalizer"))
    pre_tokenizers = _members(spec.get("pre_tokenizer"), "pretokenizers")
    byte_level = any(p.get("type") == "ByteLevel" for p in pre_tokenizers)
    covering = all(p.get("type") in _COVERING_PRE_TOKENIZERS and p.get("behavior") != "Removed" for p in pre_tokenizers)
    if factor is None or not byte_level or not covering or not vocab:
        return TextBound(None)
    longest = max(len(token) for token in vocab)  # byte-level entries spell one character per byte
    return TextBound(longest, factor)


def _normalizer_factor(normalizer: dict[str, Any] | None) -> int | None:
    """How many times shorter (in code points) the normaliser can make a text; None if it can drop text."""
    if normalizer is None:
        return 1
    members = _members(normalizer, "normalizers")
    if all(m.get("type") in _UNICODE_NORMALIZERS for m in members):
        return _MAX_CODE_POINTS_COMPOSED
    return None


def _members(component: dict[str, Any] | None, key: str) -> list[dict[str, Any]]:
    """A component's parts: the members of a `Sequence`, the component itself otherwise."""
    if component is None:
        return []
    if component.get("type") == "Sequence":
        return [part for member in component.get(key) or [] for part in _members(member, key)]
    return [component]
