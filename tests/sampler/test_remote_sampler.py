"""The remote sampler against a real second `agl-bridge serve` (a subprocess on 127.0.0.1), and against
fake servers that misbehave: exact ids and logprobs, n, seeds, stops, affinity, failover, clear errors.

Tests against the real server are marked slow: starting it (torch, LiteLLM, the model) takes ~10 s of
CPU once per session.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from remote_helpers import KEY, FakeServer
from shared_helpers import free_port

from agl_bridge.sampler.affinity import sampling_affinity
from agl_bridge.sampler.base import ContextLengthError, SamplingParams
from agl_bridge.sampler.remote import RemoteSampler, RemoteSamplerError

PROMPT = [5, 17, 300, 42, 7, 99]


@pytest.fixture
def remote(remote_target) -> RemoteSampler:
    with RemoteSampler([remote_target.url], model="tiny", api_key=KEY, vocab_size=2048, max_context=2048) as sampler:
        yield sampler


def _direct(target_url: str, body: dict) -> dict:
    response = httpx.post(
        f"{target_url}/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60
    )
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.slow
def test_ids_and_logprobs_are_exactly_what_the_server_returns(remote: RemoteSampler, remote_target) -> None:
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=11, stop=[])
    result = remote.sample(PROMPT, params)
    direct = _direct(
        remote_target.url,
        {
            "model": "tiny",
            "prompt": PROMPT,
            "max_tokens": 12,
            "temperature": 1.0,
            "seed": 11,
            "ignore_eos": True,
            "logprobs": 0,
            "return_token_ids": True,
        },
    )["choices"][0]
    (sequence,) = result.sequences
    assert result.prompt_tokens == PROMPT == direct["prompt_token_ids"]
    assert sequence.tokens == direct["token_ids"] and len(sequence.tokens) == 12
    assert sequence.logprobs == direct["logprobs"]["token_logprobs"]  # bit for bit: floats round-trip through JSON
    assert sequence.stop_reason == "length" and sequence.token_policy_versions == [0] * 12


@pytest.mark.slow
def test_n_samples_and_seeds(remote: RemoteSampler) -> None:
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=5, stop=[])
    first = remote.sample(PROMPT, params, num_samples=3)
    again = remote.sample(PROMPT, params, num_samples=3)
    other = remote.sample(PROMPT, SamplingParams(max_tokens=8, temperature=1.0, seed=6, stop=[]), num_samples=3)
    assert len(first.sequences) == 3 and all(len(s.tokens) == 8 for s in first.sequences)
    assert [s.tokens for s in first.sequences] == [s.tokens for s in again.sequences]
    assert len({tuple(s.tokens) for s in first.sequences}) > 1, "the n samples of a request differ"
    assert [s.tokens for s in other.sequences] != [s.tokens for s in first.sequences]


@pytest.mark.slow
def test_stop_token_ids_and_stop_strings_end_where_the_server_ends(remote: RemoteSampler, tiny_tokenizer) -> None:
    free = remote.sample(PROMPT, SamplingParams(max_tokens=10, temperature=0.0, stop=[])).sequences[0]
    assert len(free.tokens) == 10 and free.stop_reason == "length"
    stop_id = free.tokens[3]
    cut = remote.sample(PROMPT, SamplingParams(max_tokens=10, temperature=0.0, stop=[stop_id])).sequences[0]
    end = free.tokens.index(stop_id) + 1
    assert cut.tokens == free.tokens[:end] and cut.stop_reason == "stop"
    assert cut.logprobs == free.logprobs[:end]
    text = tiny_tokenizer.decode(free.tokens[4:6], skip_special_tokens=False)
    if text.strip() and text not in tiny_tokenizer.decode(free.tokens[:4], skip_special_tokens=False):
        by_text = remote.sample(PROMPT, SamplingParams(max_tokens=10, temperature=0.0, stop=[text])).sequences[0]
        assert by_text.stop_reason == "stop" and by_text.tokens == free.tokens[: len(by_text.tokens)]
        assert len(by_text.tokens) <= 6


@pytest.mark.slow
def test_compute_logprobs_scores_with_the_servers_model(remote: RemoteSampler) -> None:
    sampled = remote.sample(PROMPT, SamplingParams(max_tokens=6, temperature=1.0, seed=2, stop=[])).sequences[0]
    scores = remote.compute_logprobs(PROMPT + sampled.tokens)
    assert scores[0] is None and len(scores) == len(PROMPT) + 6
    assert scores[len(PROMPT) :] == pytest.approx(sampled.logprobs, abs=1e-4)


@pytest.mark.slow
async def test_async_sampling_from_an_event_loop(remote: RemoteSampler) -> None:
    params = SamplingParams(max_tokens=4, temperature=1.0, seed=3, stop=[])
    results = await asyncio.gather(*(remote.sample_async(PROMPT, params) for _ in range(4)))
    assert len({tuple(r.sequences[0].tokens) for r in results}) == 1


@pytest.mark.slow
def test_a_request_the_server_refuses_is_an_error_naming_the_server(remote: RemoteSampler, remote_target) -> None:
    small = RemoteSampler([remote_target.url], model="tiny", api_key=KEY, max_context=100_000)
    try:
        with pytest.raises(ContextLengthError, match=remote_target.url):
            small.sample([5] * 70000, SamplingParams(max_tokens=4))
    finally:
        small.close()


# ------------------------------------------------------------------ routing, failover, bad servers


@pytest.fixture
def fakes():
    servers = [FakeServer() for _ in range(3)]
    yield servers
    for server in servers:
        server.stop()


def test_requests_of_one_rollout_stay_on_one_server(fakes: list[FakeServer]) -> None:
    with RemoteSampler([f.url for f in fakes], model="m") as sampler:
        for rollout in range(12):
            with sampling_affinity(f"ro-{rollout}"):
                for turn in range(3):
                    sampler.sample([rollout, turn], SamplingParams(max_tokens=2))
    homes = {}
    for index, fake in enumerate(fakes):
        for request in fake.requests:
            homes.setdefault(request["prompt"][0], set()).add(index)
    assert len(homes) == 12 and all(len(servers) == 1 for servers in homes.values()), homes
    assert len({next(iter(s)) for s in homes.values()}) > 1, "rollouts spread over the servers"


def test_a_down_server_leaves_rotation_and_its_rollouts_move(fakes: list[FakeServer]) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with RemoteSampler([dead, fakes[0].url], model="m", connect_timeout_s=1) as sampler:
        for rollout in range(6):
            with sampling_affinity(f"ro-{rollout}"):
                result = sampler.sample([rollout, 1], SamplingParams(max_tokens=2))
            assert result.sequences[0].tokens == [1, 1]
        status = {s["url"]: s for s in sampler.status()}
    assert status[dead]["healthy"] is False and "cannot reach" in str(status[dead]["last_error"])
    assert status[fakes[0].url]["healthy"] is True and len(fakes[0].requests) == 6


def test_every_server_down_is_an_error_naming_each(fakes: list[FakeServer]) -> None:
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    with RemoteSampler(dead, model="m", connect_timeout_s=1) as sampler:
        with pytest.raises(RemoteSamplerError) as caught:
            sampler.sample([1, 2], SamplingParams(max_tokens=2))
    message = str(caught.value)
    assert all(url in message for url in dead) and "cannot reach /v1/models" in message, "asked first: its window"


def test_a_slow_server_times_out_with_an_error_naming_it(fakes: list[FakeServer]) -> None:
    fakes[0].mode = "slow"
    with RemoteSampler([fakes[0].url], model="m", timeout_s=0.3) as sampler:
        with pytest.raises(
            RemoteSamplerError, match=rf"{fakes[0].url}: no answer on /v1/completions within the timeout"
        ):
            sampler.sample([1, 2], SamplingParams(max_tokens=2))


@pytest.mark.parametrize("mode, missing", [("no_ids", "token_ids"), ("error", "HTTP 500: the engine crashed")])
def test_an_answer_without_token_ids_or_a_5xx_is_an_error_naming_the_server(fakes, mode: str, missing: str) -> None:
    fakes[0].mode = mode
    with RemoteSampler([fakes[0].url], model="m") as sampler:
        with pytest.raises(RemoteSamplerError, match=missing) as caught:
            sampler.sample([1, 2], SamplingParams(max_tokens=2))
    assert fakes[0].url in str(caught.value)


def test_the_servers_max_model_len_bounds_prompts_and_max_tokens(fakes: list[FakeServer]) -> None:
    # Regression: the context window came from the model's config (here 4096), not from what the server
    # serves (vLLM's --max-model-len, in its /v1/models), so prompts it refuses were sent, and
    # max_tokens=None went out as null (vLLM's 16 tokens).
    fakes[0].max_model_len = 64
    with RemoteSampler([fakes[0].url], model="m", max_context=4096) as sampler:
        assert sampler.max_context == 4096, "not asked yet"
        sampler.sample([1, 2, 3, 4], SamplingParams(max_tokens=None))
        assert fakes[0].requests[-1]["max_tokens"] == 60
        assert sampler.max_context == 64
        with pytest.raises(ContextLengthError, match="context window is 64 tokens") as caught:
            sampler.sample([1] * 100, SamplingParams(max_tokens=4))
        assert caught.value.max_context == 64
    assert len(fakes[0].requests) == 1, "the prompt that does not fit was never sent"


def test_a_bad_server_fails_over_to_a_good_one(fakes: list[FakeServer]) -> None:
    fakes[0].mode = "no_ids"
    with RemoteSampler([fakes[0].url, fakes[1].url], model="m") as sampler:
        for rollout in range(6):
            with sampling_affinity(f"ro-{rollout}"):
                assert sampler.sample([rollout, 3], SamplingParams(max_tokens=2)).sequences[0].tokens == [3, 1]
    assert len(fakes[1].requests) == 6


async def test_the_attempt_fails_and_nothing_is_recorded_without_ids(
    fakes: list[FakeServer], tiny_tokenizer, tmp_path: Path
) -> None:
    from agl_bridge.chat import ChatCodec
    from agl_bridge.proxy.recording import CallRecorder
    from agl_bridge.proxy.service import ChatService, RolloutRoute
    from agl_bridge.store.sqlite import SQLiteStore

    fakes[0].mode = "no_ids"
    sampler = RemoteSampler([fakes[0].url], model="tiny", vocab_size=len(tiny_tokenizer))
    try:
        async with SQLiteStore(tmp_path / "store.sqlite") as store:
            service = ChatService(
                sampler=sampler, codec=ChatCodec(tiny_tokenizer), recorder=CallRecorder(store), model_name="tiny"
            )
            request = service.parse_request({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
            with pytest.raises(RemoteSamplerError, match="token_ids"):
                await service.complete(request, RolloutRoute("ro-bad", "at-1"))
            assert [c async for c in store.iter_all_calls()] == []
    finally:
        sampler.close()


def test_bad_settings_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="ftp://x"):
        RemoteSampler(["ftp://x"], model="m")
    with pytest.raises(ValueError, match="at least one server"):
        RemoteSampler([], model="m")
    with pytest.raises(ValueError, match="timeout_s"):
        RemoteSampler(["http://127.0.0.1:1"], model="m", timeout_s=0)
    with RemoteSampler(["http://127.0.0.1:1/v1/"], model="m") as sampler:
        assert sampler.pool.servers[0].url == "http://127.0.0.1:1"
        with pytest.raises(ValueError, match="adapter_dir"):
            sampler.adapter_path(1)


def test_a_session_on_a_callers_loop_is_closed_when_that_loop_ends(fakes: list[FakeServer]) -> None:
    # The proxy's loop (asyncio.run) ends before the sampler is closed: its session must not leak.
    import gc
    import warnings

    sampler = RemoteSampler([fakes[0].url], model="m")

    async def serve_a_request() -> None:
        await sampler.sample_async([1, 2], SamplingParams(max_tokens=2))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(serve_a_request())
        sampler.close()
        gc.collect()
    leaks = [str(w.message) for w in caught if "Unclosed" in str(w.message)]
    assert leaks == []
