"""TokenCache and TokenCacheRegistry stay bounded: entries, tokens, rollouts and idle time."""

from __future__ import annotations

import threading

import pytest

from agl_bridge.chat import TokenCache, TokenCacheRegistry


class FakeClock:
    """A settable monotonic clock."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_remember_keys_by_ids_and_decodes_with_special_tokens(tiny_tokenizer, tokens) -> None:
    cache = TokenCache(tiny_tokenizer)
    ids = tokens.byte_ids("Hé") + [tokens.im_end]
    entry = cache.remember(ids, prompt_token_ids=[1, 2, 3])
    assert entry is not None
    assert entry.text == "Hé<|im_end|>"
    assert entry.token_ids == tuple(ids)
    assert entry.prompt_digest is not None
    again = cache.remember(ids)
    assert len(cache) == 1 and cache.num_tokens == len(ids)
    assert again.seq > entry.seq
    assert cache.remember([]) is None


def test_entry_and_token_bounds_evict_least_recently_used(tiny_tokenizer, tokens) -> None:
    cache = TokenCache(tiny_tokenizer, max_entries=3, max_tokens=10)
    a, b, c, d = ([tokens.encode(w)[0], tokens.im_end] for w in ["Hello", "Sure", "Well", "weather"])
    for ids in (a, b, c):
        cache.remember(ids)
    cache.touch(next(e for e in cache.entries() if e.token_ids == tuple(a)))
    cache.remember(d)  # evicts b, the least recently used
    assert [e.token_ids for e in cache.entries()] == [tuple(c), tuple(a), tuple(d)]

    cache.remember(list(range(3, 11)))  # 8 tokens: only it and one 2-token entry fit in 10
    assert cache.num_tokens <= 10
    assert len(cache) == 2
    assert cache.remember(list(range(3, 20))) is None  # longer than max_tokens on its own
    cache.clear()
    assert (len(cache), cache.num_tokens) == (0, 0)


def test_registry_lru_by_rollouts(tiny_tokenizer) -> None:
    registry = TokenCacheRegistry(tiny_tokenizer, max_rollouts=2, max_entries_per_rollout=4)
    first = registry.get("r1")
    assert registry.get("r1") is first
    assert first.max_entries == 4
    registry.get("r2")
    registry.get("r1")  # r2 is now the least recently used
    registry.get("r3")
    assert len(registry) == 2
    assert registry.peek("r2") is None
    assert registry.peek("r1") is first
    registry.discard("r1")
    assert registry.peek("r1") is None
    assert registry.peek("missing") is None and len(registry) == 1


def test_registry_idle_ttl(tiny_tokenizer) -> None:
    clock = FakeClock()
    registry = TokenCacheRegistry(tiny_tokenizer, idle_ttl_s=10.0, clock=clock)
    old = registry.get("a")
    clock.now = 6.0
    registry.get("b")
    clock.now = 12.0  # a idle for 12 s, b for 6 s
    assert registry.peek("a") is None
    assert registry.peek("b") is not None
    clock.now = 15.0
    registry.get("b")  # activity resets b's idle time
    clock.now = 24.0
    assert len(registry) == 1
    assert registry.get("a") is not old  # an expired rollout starts over with an empty cache


def test_registry_is_thread_safe_and_bounded(tiny_tokenizer) -> None:
    registry = TokenCacheRegistry(tiny_tokenizer, max_rollouts=8, max_entries_per_rollout=5)
    errors: list[BaseException] = []

    def worker(worker_id: int) -> None:
        try:
            for step in range(60):
                cache = registry.get(f"rollout-{(worker_id * 7 + step) % 13}")
                cache.remember([3 + (step % 40), 4 + worker_id, 2])
                for entry in cache.entries():
                    cache.touch(entry)
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(registry) <= 8
    for key in range(13):
        cache = registry.peek(f"rollout-{key}")
        if cache is not None:
            assert len(cache) <= 5


@pytest.mark.parametrize(
    "kwargs",
    [{"max_rollouts": 0}, {"idle_ttl_s": 0}, {"max_entries_per_rollout": 0}, {"max_tokens_per_rollout": 0}],
)
def test_registry_rejects_unbounded_settings(tiny_tokenizer, kwargs) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        TokenCacheRegistry(tiny_tokenizer, **kwargs)
