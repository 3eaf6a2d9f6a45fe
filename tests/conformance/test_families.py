"""Every architecture family is served exactly: greedy ids, sampled logprobs, live LoRA swaps, a GRPO step.

Per family (Llama, Qwen2, Qwen3, Qwen3-MoE, Mistral, Gemma 2, Gemma 3, Phi-3, GPT-2):
  - the HF sampler's greedy tokens equal transformers' `generate`, for a request alone and for
    requests that join a running batch at different cache lengths and leave it at different times
    (sliding-window families with prompts and outputs longer than their 8-token window);
  - the logprobs the sampler records equal the trainer's (`TrainingClient.forward`) to 1e-5;
  - a LoRA adapter merged live into the sampler scores like peft's own merged model to 1e-5;
  - one GRPO step (group sampling, advantages, `forward_backward`, `optim_step`, live sync) runs,
    and after the sync the sampler still scores like the trainer.
"""

from __future__ import annotations

import copy
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

from agl_bridge.models.loading import load_causal_lm
from agl_bridge.primitives import AdamParams, Datum, TrainingClient
from agl_bridge.sampler.base import SamplingParams
from agl_bridge.sampler.hf import HFSampler

TOLERANCE = 1e-5
"""Largest |sampler logprob − reference logprob| accepted, fp32."""

PROMPT_LENGTHS = (3, 7, 12, 19, 26, 33)
MAX_TOKENS = (24, 9, 17, 5, 21, 13)
"""Different lengths, so rows join the batch at different cache lengths and leave at different steps."""


def _lora_targets(family: str) -> str | list[str]:
    """What the LoRA adapts: every linear layer, but in MoE models only attention (peft adapts the experts' stacked
    weights with ParamWrapper, which the sampler refuses to merge: test_weights.py)."""
    return ["q_proj", "k_proj", "v_proj", "o_proj"] if family == "qwen3_moe" else "all-linear"


def _prompts(seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(10, 500, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


def _greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, stop=[])


def _reference_logprobs(model: Any, tokens: list[int]) -> list[float]:
    """Raw logprob of each token after the first, from a plain forward of `model`."""
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens[1:]).unsqueeze(1)).squeeze(1).tolist()


def _gap(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


@pytest.mark.slow
def test_greedy_equals_generate_alone_and_batched(family_dir: Path, family_tokenizer: Any, results: dict) -> None:
    model = load_causal_lm(family_dir)
    prompts = _prompts()
    with HFSampler(model, family_tokenizer, seed=0) as sampler:
        alone = [sampler.sample(p, _greedy(k)).sequences[0].tokens for p, k in zip(prompts, MAX_TOKENS, strict=True)]
        # The first half starts together; the second half joins once the first rows are mid-decode.
        first_tokens = threading.Event()
        counted = [0]

        def on_token(_event: object) -> None:
            counted[0] += 1
            if counted[0] == 3:
                first_tokens.set()

        first = [sampler.submit(prompts[0], _greedy(MAX_TOKENS[0]), on_token=on_token)]
        first += [sampler.submit(p, _greedy(k)) for p, k in zip(prompts[1:3], MAX_TOKENS[1:3], strict=True)]
        assert first_tokens.wait(60)
        later = [sampler.submit(p, _greedy(k)) for p, k in zip(prompts[3:], MAX_TOKENS[3:], strict=True)]
        batched = [future.result(timeout=120).sequences[0].tokens for future in first + later]
    generated = []
    for prompt, max_tokens in zip(prompts, MAX_TOKENS, strict=True):
        # No end-of-sequence ids: generate would suppress them (min_new_tokens) where stop=[] samples them.
        output = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=None,
        )
        generated.append(output[0, len(prompt) :].tolist())
    assert alone == generated
    assert batched == alone
    results["greedy == generate"] = "yes"


def test_sampled_logprobs_equal_the_trainers(family_dir: Path, family_tokenizer: Any, results: dict) -> None:
    params = SamplingParams(max_tokens=20, temperature=1.0, stop=[], seed=7)
    with HFSampler(load_causal_lm(family_dir), family_tokenizer, seed=0) as sampler:
        futures = [sampler.submit(p, params, num_samples=2) for p in _prompts(seed=1)]
        samples = [(f.result(timeout=120).prompt_tokens, s) for f in futures for s in f.result().sequences]
        with TrainingClient(str(family_dir), lora_rank=4, device="cpu", sampler=sampler) as client:
            data = [
                Datum.from_sequence(prompt + s.tokens, [0] * len(prompt) + [1] * len(s.tokens)) for prompt, s in samples
            ]
            trained = client.forward(data).loss_fn_outputs
    gaps = [
        _gap(out["logprobs"][len(prompt) - 1 :].tolist(), s.logprobs)
        for (prompt, s), out in zip(samples, trained, strict=True)
    ]
    results["logprob gap max"] = max(gaps)
    assert max(gaps) <= TOLERANCE


def test_live_lora_swap_scores_like_peft_merged(
    family: str, family_dir: Path, family_tokenizer: Any, results: dict
) -> None:
    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=_lora_targets(family))
    peft_model = get_peft_model(load_causal_lm(family_dir), config)
    for name, param in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)
    adapter = get_peft_model_state_dict(peft_model)
    merged = copy.deepcopy(peft_model).merge_and_unload()
    prompt = _prompts(seed=2)[4]
    with HFSampler(load_causal_lm(family_dir), family_tokenizer, seed=0) as sampler:
        before = sampler.sample(prompt, _greedy(16)).sequences[0]
        assert sampler.load_lora(adapter, scaling=8 / 4) == 1
        after = sampler.sample(prompt, SamplingParams(max_tokens=16, temperature=1.0, stop=[], seed=3)).sequences[0]
        scored = sampler.compute_logprobs(prompt + after.tokens)[1:]
    expected = _reference_logprobs(merged, prompt + after.tokens)
    gap = max(_gap(scored, expected), _gap(after.logprobs, expected[len(prompt) - 1 :]))
    results["LoRA swap gap max"] = gap
    assert gap <= TOLERANCE
    assert after.token_policy_versions == [1] * len(after.tokens)
    adapted = _reference_logprobs(merged, prompt + before.tokens)[len(prompt) - 1 :]
    assert _gap(adapted, before.logprobs) > 1e-3, "the adapter changes the model"


def test_one_grpo_step_trains_and_syncs(family: str, family_dir: Path, family_tokenizer: Any, results: dict) -> None:
    prompt = list(
        family_tokenizer.apply_chat_template(
            [{"role": "user", "content": "Say you are 7."}], add_generation_prompt=True, return_dict=False
        )
    )
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=11)
    with TrainingClient(str(family_dir), lora_rank=4, target_modules=_lora_targets(family), device="cpu") as client:
        sampling = client.save_weights_and_get_sampling_client()
        group = sampling.sample(prompt, params, num_samples=4).sequences
        # Any reward that differs within the group: here the mean surprisal of the answer.
        rewards = [-sum(s.logprobs) / len(s.logprobs) for s in group]
        mean = sum(rewards) / len(rewards)
        data = [
            Datum.from_sequence(
                prompt + s.tokens,
                [0] * len(prompt) + [1] * len(s.tokens),
                [None] * len(prompt) + s.logprobs,
                advantages=reward - mean,
            )
            for s, reward in zip(group, rewards, strict=True)
        ]
        step = client.forward_backward(data, "importance_sampling").metrics
        assert step["logprob_diff_abs_max"] <= TOLERANCE, "on-policy: trainer and sampler logprobs agree"
        client.optim_step(AdamParams(learning_rate=1e-2))
        synced = client.save_weights_and_get_sampling_client()
        assert synced.weights_version == sampling.weights_version + 1
        answer = synced.sample(prompt, params).sequences[0]
        assert set(answer.token_policy_versions) == {synced.weights_version}
        rescored = client.forward(
            [Datum.from_sequence(prompt + answer.tokens, [0] * len(prompt) + [1] * len(answer.tokens))]
        )
        trainer = rescored.loss_fn_outputs[0]["logprobs"][len(prompt) - 1 :].tolist()
        moved = client.forward(data[:1]).loss_fn_outputs[0]["logprobs"][len(prompt) - 1 :].tolist()
    assert _gap(trainer, answer.logprobs) <= TOLERANCE, "after the sync the sampler samples the trained policy"
    assert _gap(moved, group[0].logprobs) > 1e-4, "the step changed the policy"
    results["GRPO step"] = "ok"
