"""Token ids → the text each one stands for, with the run's tokenizer, loaded in the background.

Loading a tokenizer imports transformers (seconds), so it starts in a thread when the viewer starts
and pages that need it wait for it. Each id is decoded on its own (`decode([id])`, special tokens
kept) and cached; a token that holds part of a multi-byte character shows as U+FFFD, as in every
per-token view. Without a model (or if it cannot be loaded) tokens show as their ids.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from agl_bridge.viewer.slow_imports import load_tokenizer


class TokenTexts:
    """Per-token text for one model's tokenizer (`model`: a `--model` value, or None for ids only)."""

    def __init__(self, model: str | None, *, load_timeout_s: float = 120.0) -> None:
        self.model = model
        self._load_timeout_s = load_timeout_s
        self._tokenizer: Any = None
        self._special: frozenset[int] = frozenset()
        self._cache: dict[int, str] = {}
        self._error: str | None = None if model else "no model given (pass --model or a run directory)"
        self._loaded = threading.Event()
        if model:
            threading.Thread(target=self._load, name="agl-view-tokenizer", daemon=True).start()
        else:
            self._loaded.set()

    def _load(self) -> None:
        try:
            tokenizer = load_tokenizer(self.model)  # type: ignore[arg-type]  # set when this thread runs
            self._special = frozenset(getattr(tokenizer, "all_special_ids", ()) or ())
            self._tokenizer = tokenizer
        except Exception as exc:  # any failure leaves the viewer working, with ids for text
            self._error = f"cannot load the tokenizer of {self.model!r}: {exc}"
        finally:
            self._loaded.set()

    @property
    def status(self) -> str:
        """ "ready", "loading", or why token text is unavailable."""
        if not self._loaded.is_set():
            return "loading"
        return "ready" if self._tokenizer is not None else (self._error or "unavailable")

    def wait(self) -> bool:
        """Wait for the tokenizer; True if it is usable."""
        self._loaded.wait(self._load_timeout_s)
        return self._tokenizer is not None

    def is_special(self, token_id: int) -> bool:
        """Whether `token_id` is one of the tokenizer's special tokens (e.g. <|im_start|>)."""
        return token_id in self._special

    def texts(self, ids: Sequence[int]) -> list[str] | None:
        """The text of each id, or None when no tokenizer is available."""
        if not self.wait():
            return None
        cache, tokenizer = self._cache, self._tokenizer
        out = []
        for token_id in ids:
            text = cache.get(token_id)
            if text is None:
                text = tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
                cache[token_id] = text
            out.append(text)
        return out
