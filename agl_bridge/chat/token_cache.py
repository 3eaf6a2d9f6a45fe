"""Per-rollout memory of sampled responses, so later prompts can reuse their exact token ids.

Why: with a byte-level BPE, `encode(decode(ids)) != ids` happens often for sampled text. When an
agent sends the assistant message back in its next request, re-tokenizing its text would give a
prompt that does not extend `previous prompt + sampled response` token for token, and the trainer
needs that exact extension. `TokenCache` keeps each sampled response's ids with the text it decodes
to; `ChatCodec.encode_prompt` splices those ids back in where the template renders that text.

Everything is bounded: a cache keeps at most `max_entries` responses and `max_tokens` ids (least
recently used go first), and `TokenCacheRegistry` keeps at most `max_rollouts` caches and drops
those idle for longer than `idle_ttl_s`.
"""

from __future__ import annotations

import hashlib
import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any


def decode_exact(tokenizer: Any, token_ids: Sequence[int]) -> str:
    """Decode ids to the text a chat template would have to render for them: special tokens kept, no cleanup."""
    return tokenizer.decode(list(token_ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def prompt_digest(token_ids: Sequence[int]) -> bytes:
    """A short fingerprint of a prompt's token ids (comparing prompts without storing them)."""
    return hashlib.blake2b(array("q", token_ids).tobytes(), digest_size=16).digest()


@dataclass(frozen=True)
class CachedResponse:
    """One sampled response: its exact ids, the text they decode to, and the prompt it answered.

    `prompt_digest` (None when the prompt was not given) tells apart two responses that decode to
    the same text with different ids; `seq` orders responses by when they were remembered; `call`
    is the (store sequence, choice) of the call that sampled it, when known.
    """

    token_ids: tuple[int, ...]
    text: str
    prompt_digest: bytes | None
    seq: int
    call: tuple[int, int] | None = None


class TokenCache:
    """The sampled responses of one rollout, keyed by their token ids, bounded and thread-safe."""

    def __init__(self, tokenizer: Any, *, max_entries: int = 256, max_tokens: int = 262_144) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self._tokenizer = tokenizer
        self.max_entries = max_entries
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[int, ...], CachedResponse] = OrderedDict()
        self._num_tokens = 0
        self.store_sequence = -1
        """The store sequence up to which this rollout's calls are all remembered (-1: none); kept by the
        proxy, which refills the cache from the store's later calls when it is behind."""
        self._seq = 0
        self._lock = threading.Lock()

    def remember(
        self,
        response_token_ids: Sequence[int],
        *,
        prompt_token_ids: Sequence[int] | None = None,
        call: tuple[int, int] | None = None,
    ) -> CachedResponse | None:
        """Store a sampled response (ending with its stop token, if it had one) for later prompts.

        Pass `prompt_token_ids` (the prompt the response was sampled for) whenever it is known: it
        makes the choice exact when two responses decode to the same text; `call` (the recorded
        call's store sequence and choice) lets later requests say which answers they carry. Returns
        the entry, or None for an empty response or one longer than `max_tokens`.
        """
        ids = tuple(int(t) for t in response_token_ids)
        if not ids or len(ids) > self.max_tokens:
            return None
        text = decode_exact(self._tokenizer, ids)
        digest = prompt_digest(prompt_token_ids) if prompt_token_ids is not None else None
        with self._lock:
            old = self._entries.pop(ids, None)
            if old is not None:
                self._num_tokens -= len(ids)
            self._seq += 1
            entry = CachedResponse(token_ids=ids, text=text, prompt_digest=digest, seq=self._seq, call=call)
            self._entries[ids] = entry
            self._num_tokens += len(ids)
            while len(self._entries) > self.max_entries or self._num_tokens > self.max_tokens:
                _, evicted = self._entries.popitem(last=False)
                self._num_tokens -= len(evicted.token_ids)
            return entry

    def entries(self) -> list[CachedResponse]:
        """A snapshot of the stored responses, least recently used first."""
        with self._lock:
            return list(self._entries.values())

    def touch(self, entry: CachedResponse) -> None:
        """Mark `entry` as just used, so eviction keeps it (a reused response is still in the conversation)."""
        with self._lock:
            if entry.token_ids in self._entries:
                self._entries.move_to_end(entry.token_ids)

    def clear(self) -> None:
        """Forget every response."""
        with self._lock:
            self._entries.clear()
            self._num_tokens = 0

    @property
    def num_tokens(self) -> int:
        """Total token ids stored."""
        with self._lock:
            return self._num_tokens

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


class TokenCacheRegistry:
    """Rollout key -> TokenCache, bounded by count (LRU) and idle time; safe to share between threads.

    A rollout whose cache was dropped (evicted or idle too long) gets a fresh, empty one: its next
    prompt is then tokenized from text and `PromptEncoding.prefix_breaks` cannot flag the
    difference, so size the limits above the number of rollouts in flight at once.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        max_rollouts: int = 1024,
        max_entries_per_rollout: int = 256,
        max_tokens_per_rollout: int = 262_144,
        idle_ttl_s: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_rollouts < 1:
            raise ValueError(f"max_rollouts must be >= 1, got {max_rollouts}")
        if max_entries_per_rollout < 1:
            raise ValueError(f"max_entries_per_rollout must be >= 1, got {max_entries_per_rollout}")
        if max_tokens_per_rollout < 1:
            raise ValueError(f"max_tokens_per_rollout must be >= 1, got {max_tokens_per_rollout}")
        if not idle_ttl_s > 0:
            raise ValueError(f"idle_ttl_s must be > 0 seconds, got {idle_ttl_s}")
        self._tokenizer = tokenizer
        self.max_rollouts = max_rollouts
        self.max_entries_per_rollout = max_entries_per_rollout
        self.max_tokens_per_rollout = max_tokens_per_rollout
        self.idle_ttl_s = idle_ttl_s
        self._clock = clock
        # Ordered by last access, oldest first: expired and LRU victims are always at the front.
        self._caches: OrderedDict[Hashable, tuple[TokenCache, float]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, rollout_key: Hashable) -> TokenCache:
        """The cache of `rollout_key`, created if missing; counts as activity for the idle timeout."""
        now = self._clock()
        with self._lock:
            self._expire(now)
            found = self._caches.pop(rollout_key, None)
            if found is not None:
                cache = found[0]
            else:
                cache = TokenCache(
                    self._tokenizer,
                    max_entries=self.max_entries_per_rollout,
                    max_tokens=self.max_tokens_per_rollout,
                )
                while len(self._caches) >= self.max_rollouts:
                    self._caches.popitem(last=False)
            self._caches[rollout_key] = (cache, now)
            return cache

    def peek(self, rollout_key: Hashable) -> TokenCache | None:
        """The cache of `rollout_key` if it exists and is not expired; does not count as activity."""
        now = self._clock()
        with self._lock:
            self._expire(now)
            found = self._caches.get(rollout_key)
            return found[0] if found is not None else None

    def discard(self, rollout_key: Hashable) -> None:
        """Drop a finished rollout's cache now instead of waiting for the idle timeout."""
        with self._lock:
            self._caches.pop(rollout_key, None)

    def __len__(self) -> int:
        now = self._clock()
        with self._lock:
            self._expire(now)
            return len(self._caches)

    def _expire(self, now: float) -> None:
        """Drop caches idle for longer than the TTL (caller holds the lock)."""
        while self._caches:
            key, (_, last_used) = next(iter(self._caches.items()))
            if now - last_used <= self.idle_ttl_s:
                break
            del self._caches[key]
