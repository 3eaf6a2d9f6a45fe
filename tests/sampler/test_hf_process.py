"""The HF sampler in a child process: the in-process sampler's answers and promises, across the process boundary.

Each child loads torch and the model (seconds of CPU), so the tests share a few: one read-only, one
whose weights change, and one that is closed or killed.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
from transformers import AutoModelForCausalLM

from agl_bridge.sampler.base import (
    ContextLengthError,
    SampleResult,
    SamplingParamError,
    SamplingParams,
    StreamingTokenSampler,
    TokenEvent,
    TokenSampler,
)
from agl_bridge.sampler.hf import HFSampler, SamplerClosedError
from agl_bridge.sampler.hf_process import HFProcessSampler, SamplerProcessError

GREEDY = SamplingParams(max_tokens=24, temperature=0, stop=[])
LONG = SamplingParams(max_tokens=3000, stop=[])


def _prompts(count: int, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 40, (count,), generator=generator).tolist()
    return [torch.randint(10, 1900, (n,), generator=generator).tolist() for n in lengths]


def _until(condition: Callable[[], bool], what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


@pytest.fixture(scope="module")
def child(tiny_model_dir: Path) -> Iterator[HFProcessSampler]:
    """A process sampler over the tiny model; the tests using it change no weights."""
    with HFProcessSampler(tiny_model_dir, seed=0, torch_threads=1) as sampler:
        yield sampler


@pytest.fixture(scope="module")
def local(tiny_model_dir: Path, tiny_tokenizer) -> Iterator[HFSampler]:
    """The same model in this process, for comparison."""
    with HFSampler(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tiny_tokenizer, seed=0) as sampler:
        yield sampler


def test_implements_the_protocols(child: HFProcessSampler, local: HFSampler) -> None:
    assert isinstance(child, TokenSampler) and isinstance(child, StreamingTokenSampler)
    assert (child.max_context, child.vocab_size, child.max_batch_size) == (
        local.max_context,
        local.vocab_size,
        local.max_batch_size,
    )
    assert child.policy_version == 0 and child.embeddings_tied
    assert child.model_config == json.loads(local.model.config.to_json_string(use_diff=False))


def test_answers_exactly_as_the_sampler_in_this_process(child: HFProcessSampler, local: HFSampler) -> None:
    prompts = _prompts(4, seed=1)
    seeded = SamplingParams(max_tokens=20, temperature=0.8, top_k=50, stop=[], seed=7)
    for prompt in prompts:
        for params in (GREEDY, seeded):
            ours, theirs = child.sample(prompt, params, num_samples=2), local.sample(prompt, params, num_samples=2)
            assert ours.prompt_tokens == theirs.prompt_tokens == prompt
            for a, b in zip(ours.sequences, theirs.sequences, strict=True):
                assert a.tokens == b.tokens and a.stop_reason == b.stop_reason
                assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
                assert a.token_policy_versions == [0] * len(a.tokens)
    sequence = prompts[0] + child.sample(prompts[0], GREEDY).sequences[0].tokens
    assert child.compute_logprobs(sequence)[1:] == pytest.approx(local.compute_logprobs(sequence)[1:], abs=1e-5)


def test_stop_strings_and_the_models_end_of_sequence_stop_in_the_child(child: HFProcessSampler, tiny_tokenizer) -> None:
    prompt = _prompts(1, seed=6)[0]
    free_run = child.sample(prompt, GREEDY).sequences[0].tokens
    text = tiny_tokenizer.decode(free_run)
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    stopped = child.sample(prompt, SamplingParams(max_tokens=24, temperature=0, stop=[stop])).sequences[0]
    assert stopped.stop_reason == "stop" and stop in tiny_tokenizer.decode(stopped.tokens)
    assert stopped.tokens == free_run[: len(stopped.tokens)]


async def test_concurrent_requests_are_batched_and_each_gets_its_own_answer(child: HFProcessSampler) -> None:
    prompts = _prompts(12, seed=12)
    results = await asyncio.gather(*(child.sample_async(p, GREEDY) for p in prompts))
    assert [r.prompt_tokens for r in results] == prompts
    assert [r.sequences[0].tokens for r in results] == [child.sample(p, GREEDY).sequences[0].tokens for p in prompts]


async def test_stream_yields_each_token_then_the_same_result(child: HFProcessSampler) -> None:
    prompt = _prompts(1, seed=16)[0]
    params = SamplingParams(max_tokens=12, stop=[], seed=4)
    *events, result = [item async for item in child.sample_stream(prompt, params, num_samples=2)]
    assert isinstance(result, SampleResult)
    for index, sequence in enumerate(result.sequences):
        mine = [e for e in events if e.sample_index == index]
        assert [e.token for e in mine] == sequence.tokens
        assert [e.logprob for e in mine] == sequence.logprobs
        assert [e.policy_version for e in mine] == sequence.token_policy_versions
    assert result.sequences[0].tokens == child.sample(prompt, params).sequences[0].tokens


def test_on_token_sees_every_token_before_the_result(child: HFProcessSampler) -> None:
    seen: list[int] = []
    future = child.submit([3, 4, 5], SamplingParams(max_tokens=9, stop=[]), on_token=lambda e: seen.append(e.token))
    assert seen == future.result(timeout=120).sequences[0].tokens


async def test_leaving_a_stream_early_frees_its_rows_in_the_child(child: HFProcessSampler) -> None:
    stream = child.sample_stream([1, 2, 3], LONG)
    async for _ in stream:
        break
    await stream.aclose()
    _until(lambda: child.running_sequences == 0, "the stream left early still samples")


def test_a_cancelled_request_stops_sampling_in_the_child(child: HFProcessSampler) -> None:
    started = threading.Event()
    running = child.submit([1, 2, 3], LONG, num_samples=3, on_token=lambda _: started.set())
    assert started.wait(120)
    assert child.running_sequences == 3
    assert running.cancel(), "a running request can be cancelled"
    _until(lambda: child.running_sequences == 0, "the cancelled request still samples")
    assert child.sample([4, 5, 6], SamplingParams(max_tokens=2, stop=[])).sequences[0].tokens


async def test_cancelling_the_awaiting_task_cancels_the_request(child: HFProcessSampler) -> None:
    task = asyncio.ensure_future(child.sample_async([7, 8, 9], LONG))
    await asyncio.to_thread(_until, lambda: child.running_sequences == 1, "the request never started")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.to_thread(_until, lambda: child.running_sequences == 0, "the cancelled task's request runs on")


def test_bad_requests_are_refused_here_with_the_reason(child: HFProcessSampler) -> None:
    with pytest.raises(ContextLengthError, match=r"70000 tokens.*65536"):
        child.submit([1] * 70000, SamplingParams(max_tokens=1))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        child.submit([1, 10**6], SamplingParams(max_tokens=1))
    with pytest.raises(ValueError, match="num_samples"):
        child.submit([1], SamplingParams(max_tokens=1), num_samples=10**6)
    with pytest.raises(SamplingParamError, match="temperature") as refused:
        child.submit([1], SamplingParams(temperature=-1))
    assert refused.value.field == "temperature"
    with pytest.raises(ContextLengthError):  # raised in the child, the same type here
        child.compute_logprobs([1] * 70000)


async def test_top_logprobs_match_the_sampler_in_this_process(child: HFProcessSampler, local: HFSampler) -> None:
    sequence = _prompts(1, seed=17)[0]
    ours = await child.compute_top_logprobs_async(sequence, 3, start=5)
    theirs = await local.compute_top_logprobs_async(sequence, 3, start=5)
    assert [[t for t, _ in row] for row in ours] == [[t for t, _ in row] for row in theirs]
    assert [v for row in ours for _, v in row] == pytest.approx([v for row in theirs for _, v in row], abs=1e-5)


@pytest.mark.slow
def test_weight_swaps_land_between_steps_and_loras_merge_as_in_this_process(
    tiny_model_dir: Path, tiny_tokenizer
) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    new_weights = {name: value + 0.01 * torch.randn_like(value) for name, value in model.state_dict().items()}
    with HFProcessSampler(tiny_model_dir, seed=0, torch_threads=1) as sampler:
        events: list[TokenEvent] = []
        first_token, swapped_token = threading.Event(), threading.Event()

        def on_token(event: TokenEvent) -> None:
            events.append(event)
            first_token.set()
            if event.policy_version == 1:
                swapped_token.set()

        others = [sampler.submit(p, LONG) for p in _prompts(7)]
        running = sampler.submit([1, 2, 3], LONG, on_token=on_token)
        assert first_token.wait(120)
        with pytest.raises(ValueError, match="does not exist"):
            sampler.load_weights({"no.such.weight": torch.zeros(1)})
        assert sampler.policy_version == 0
        assert sampler.load_weights(new_weights) == 1 == sampler.policy_version
        assert swapped_token.wait(120), "the sequence goes on with the new weights"
        for future in [running, *others]:
            future.cancel()
        versions = [event.policy_version for event in events]
        assert versions == sorted(versions) and set(versions) == {0, 1}, "the swap landed mid-sequence, in order"
        sequence = list(range(20, 60))
        model.load_state_dict(new_weights)
        with torch.no_grad():
            expected = torch.log_softmax(model(torch.tensor([sequence])).logits[0, :-1], -1)
        expected = expected.gather(1, torch.tensor(sequence[1:]).unsqueeze(1)).squeeze(1)
        assert sampler.compute_logprobs(sequence)[1:] == pytest.approx(expected.tolist(), abs=1e-4)

        config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear")
        torch.manual_seed(0)
        peft_model = get_peft_model(model, config)
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(param, std=0.05)
        assert sampler.load_lora(get_peft_model_state_dict(peft_model), scaling=16 / 8, version=7) == 7
        with torch.no_grad():
            logits = peft_model(torch.tensor([sequence])).logits[0, :-1]
        expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(sequence[1:]).unsqueeze(1)).squeeze(1)
        assert sampler.compute_logprobs(sequence)[1:] == pytest.approx(expected.tolist(), abs=1e-4)
        assert set(
            sampler.sample([1, 2], SamplingParams(max_tokens=3, stop=[])).sequences[0].token_policy_versions
        ) == {7}


@pytest.mark.slow
def test_a_dead_child_fails_what_runs_and_what_comes_then_close_fails_what_waits(tiny_model_dir: Path) -> None:
    with HFProcessSampler(tiny_model_dir, seed=0, torch_threads=1) as sampler:
        running = sampler.submit([1, 2, 3], LONG)
        _until(lambda: sampler.running_sequences == 1, "the request never started")
        sampler._process.kill()  # the child dies mid-request (out of memory, say)
        with pytest.raises(SamplerProcessError, match="exited unexpectedly"):
            running.result(timeout=60)
        with pytest.raises(SamplerProcessError, match="exited unexpectedly"):
            sampler.sample([1, 2], GREEDY)
    with HFProcessSampler(tiny_model_dir, seed=0, torch_threads=1) as sampler:
        waiting = sampler.submit([1, 2, 3], LONG)
        _until(lambda: sampler.running_sequences == 1, "the request never started")
        sampler.close()
        sampler.close()  # closing twice is harmless
        with pytest.raises(SamplerClosedError):
            waiting.result(timeout=60)
        with pytest.raises(SamplerClosedError, match="closed"):
            sampler.sample([1, 2], GREEDY)
        with pytest.raises(SamplerClosedError, match="closed"):
            sampler.compute_logprobs([1, 2])
        assert sampler._process.returncode == 0, "the child exits on its own once closed"


@pytest.mark.slow
def test_a_model_that_cannot_load_raises_the_childs_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "no-such-architecture"}')
    with pytest.raises((OSError, ValueError, KeyError)) as refused:
        HFProcessSampler(tmp_path)
    assert "no-such-architecture" in str(refused.value)


def test_results_are_finite_logprobs(child: HFProcessSampler) -> None:
    result = child.sample(_prompts(1, seed=3)[0], SamplingParams(max_tokens=10, stop=[]), num_samples=3)
    assert all(math.isfinite(lp) and lp <= 0 for s in result.sequences for lp in s.logprobs)


def test_the_wire_carries_values_exactly_and_rebuilds_only_known_errors() -> None:
    from agl_bridge.sampler.base import SampledSequence
    from agl_bridge.sampler.hf_wire import (
        decode_error,
        decode_params,
        decode_result,
        encode_error,
        encode_params,
        encode_result,
    )

    def over_the_wire(value: object) -> object:
        return json.loads(json.dumps(value))

    for params in (SamplingParams(stop=None), SamplingParams(stop=[]), SamplingParams(stop=("</s>", 7), seed=3)):
        decoded = decode_params(over_the_wire(encode_params(params)))  # type: ignore[arg-type]
        assert decoded.stop_strings == params.stop_strings and decoded.stop_token_ids == params.stop_token_ids
        assert (decoded.stop is None) == (params.stop is None) and decoded.seed == params.seed
    logprobs = [-1 / 3, -2.220446049250313e-16, -87.33654475055310898657]
    result = SampleResult([1, 2], [SampledSequence([5, 6, 7], logprobs, "length", [0, 0, 1])])
    assert decode_result(over_the_wire(encode_result(result))) == result  # type: ignore[arg-type]
    rebuilt = decode_error(over_the_wire(encode_error(SamplingParamError("top_p", "top_p must be in (0, 1]"))))  # type: ignore[arg-type]
    assert isinstance(rebuilt, SamplingParamError) and rebuilt.field == "top_p"
    assert isinstance(decode_error(over_the_wire(encode_error(ContextLengthError(9, 8)))), ContextLengthError)  # type: ignore[arg-type]

    class Strange(Exception):
        pass

    unknown = decode_error(over_the_wire(encode_error(Strange("odd"))))  # type: ignore[arg-type]
    assert type(unknown) is RuntimeError and str(unknown) == "Strange: odd"
