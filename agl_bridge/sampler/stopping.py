"""Deciding when a sampled sequence is finished: stop token ids, stop strings, length limits."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from agl_bridge.sampler.base import StopReason

# A character is at most 4 UTF-8 bytes and a byte-level token is at least one byte, so a window of
# this many tokens per stop-string character always decodes to the whole stop string.
_TOKENS_PER_CHAR = 4


class StopChecker:
    """Tells, after each sampled token, whether (and why) a sequence must end."""

    def __init__(
        self,
        *,
        stop_token_ids: Sequence[int],
        stop_strings: Sequence[str],
        max_new_tokens: int,
        decode: Callable[[list[int]], str] | None,
    ) -> None:
        if stop_strings and decode is None:
            raise ValueError("stop strings need a tokenizer to decode text; give the sampler a tokenizer")
        self._stop_ids = frozenset(stop_token_ids)
        self._stop_strings = tuple(stop_strings)
        self._window = _TOKENS_PER_CHAR * max((len(s) for s in stop_strings), default=0) + _TOKENS_PER_CHAR
        self._max_new_tokens = max_new_tokens
        self._decode = decode

    def check(self, tokens: list[int]) -> StopReason | None:
        """'stop' or 'length' if the sequence ends with its last token, else None."""
        if tokens[-1] in self._stop_ids:
            return "stop"
        if self._stop_strings:
            assert self._decode is not None
            tail = self._decode(tokens[-self._window :])
            if any(s in tail for s in self._stop_strings):
                return "stop"
        if len(tokens) >= self._max_new_tokens:
            return "length"
        return None
