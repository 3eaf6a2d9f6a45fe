"""A rollout's token cache recovered from the store: what makes several proxies (or a restarted one) exact.

Turn k+1's prompt must extend turn k's prompt + sampled ids token for token, and the chat codec
gets those ids from the rollout's `TokenCache`. The cache lives in one proxy's memory; when a
rollout's turns land on different proxies (several `serve` processes on one store), or the proxy
restarted, the turns it did not serve are missing. They are in the store, though: every call is
committed before its response returns, so by the time the agent sends turn k+1, turn k is readable
by every proxy on the store.

`StoreTokenHistory.catch_up` reads the attempt's calls after the cache's `store_sequence` and
remembers their sampled ids. `ChatService` calls it only when the request holds an assistant
message the cache does not know (`ChatCodec.knows_every_response`): a proxy that served the
previous turn itself answers from memory, with no store read (the fast path).
"""

from __future__ import annotations

from agl_bridge.chat import TokenCache
from agl_bridge.store.base import Store


class StoreTokenHistory:
    """Refills rollouts' token caches from the calls `store` holds."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.catch_ups = 0
        """How many times a cache was behind and read the store (for tests and monitoring)."""

    async def catch_up(self, cache: TokenCache, rollout_id: str, attempt_id: str | None) -> int:
        """Remember the attempt's calls stored after `cache.store_sequence`; returns how many were added."""
        self.catch_ups += 1
        after = cache.store_sequence
        added = 0
        newest = after
        async for call in self.store.iter_llm_calls(rollout_id, attempt_id):
            if call.attempt_id != attempt_id or call.sequence is None or call.sequence <= after:
                continue
            newest = max(newest, call.sequence)
            if call.response_token_ids:  # text-only calls (other LiteLLM models) have no ids to reuse
                cache.remember(
                    call.response_token_ids,
                    prompt_token_ids=call.prompt_token_ids,
                    call=(call.sequence, call.choice_index),
                )
                added += 1
        cache.store_sequence = newest
        return added


def recorded(cache: TokenCache, sequences: list[int]) -> None:
    """Advance `cache.store_sequence` past a call this proxy just recorded, if no earlier call is missing.

    Sequences are gap-free per attempt only among what was stored; a reward or span between two
    calls leaves a gap in the calls, which makes the next catch-up read from the older mark (reads a
    little more, misses nothing).
    """
    if sequences and min(sequences) == cache.store_sequence + 1:
        cache.store_sequence = max(sequences)
