"""Live LoRA merges by layer type: GPT-2's Conv1D (stored [in, out]) merges transposed, square ones included;
module types the sampler cannot merge into are refused by name, and a refused adapter changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
from transformers.pytorch_utils import Conv1D

from agl_bridge.models.loading import load_causal_lm
from agl_bridge.models.tiny import build_tiny_model
from agl_bridge.sampler.hf import HFSampler

SEQUENCE = list(range(30, 70))


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny GPT-2 and Qwen3-MoE models (hidden 64: GPT-2's attention output projection is a square Conv1D)."""
    root = tmp_path_factory.mktemp("weights")
    return {
        family: build_tiny_model(root / family, hidden=64, vocab=512, family=family) for family in ("gpt2", "qwen3_moe")
    }


def _adapter(model_dir: Path, target_modules: str | list[str]) -> tuple[dict[str, torch.Tensor], torch.nn.Module]:
    """A peft LoRA with random (non-zero) A and B, and peft's own merged model of it."""
    torch.manual_seed(0)
    peft_model = get_peft_model(load_causal_lm(model_dir), LoraConfig(r=4, lora_alpha=8, target_modules=target_modules))
    for name, param in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)
    return get_peft_model_state_dict(peft_model), peft_model.merge_and_unload()


def _logprobs(model: torch.nn.Module) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([SEQUENCE])).logits[0, :-1]
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(SEQUENCE[1:]).unsqueeze(1)).squeeze(1).tolist()


def test_square_conv1d_merges_transposed_like_peft(family_dirs: dict[str, Path]) -> None:
    model = load_causal_lm(family_dirs["gpt2"])
    projection = model.get_submodule("transformer.h.0.attn.c_proj")
    assert isinstance(projection, Conv1D) and projection.weight.shape == (64, 64), "the case under test: square"
    adapter, merged = _adapter(family_dirs["gpt2"], ["attn.c_proj"])
    with HFSampler(model) as sampler:
        sampler.load_lora(adapter, scaling=2.0)
        served = sampler.compute_logprobs(SEQUENCE)[1:]
    assert served == pytest.approx(_logprobs(merged), abs=1e-5)

    # What merging [out, in] into the [in, out] weight would have served instead: clearly different.
    untransposed = load_causal_lm(family_dirs["gpt2"])
    with torch.no_grad():
        for layer in (0, 1):
            name = f"base_model.model.transformer.h.{layer}.attn.c_proj"
            delta = adapter[f"{name}.lora_B.weight"] @ adapter[f"{name}.lora_A.weight"] * 2.0
            untransposed.get_submodule(f"transformer.h.{layer}.attn.c_proj").weight += delta
    assert max(abs(a - b) for a, b in zip(_logprobs(untransposed), served, strict=True)) > 1e-2


def test_all_conv1d_layers_of_gpt2_merge_like_peft(family_dirs: dict[str, Path]) -> None:
    adapter, merged = _adapter(family_dirs["gpt2"], "all-linear")
    assert any(".mlp.c_fc." in key for key in adapter), "all-linear adapts GPT-2's Conv1D layers"
    with HFSampler(load_causal_lm(family_dirs["gpt2"])) as sampler:
        sampler.load_lora(adapter, scaling=2.0)
        assert sampler.compute_logprobs(SEQUENCE)[1:] == pytest.approx(_logprobs(merged), abs=1e-5)


@pytest.mark.parametrize(
    ("family", "targets", "module", "kind"),
    [
        ("gpt2", ["wte"], "transformer.wte", "Embedding"),
        ("qwen3_moe", "all-linear", "model.layers.0.mlp.experts", "Qwen3MoeExperts"),
    ],
)
def test_unmergeable_module_types_are_refused_by_name(
    family_dirs: dict[str, Path], family: str, targets: str | list[str], module: str, kind: str
) -> None:
    adapter, _ = _adapter(family_dirs[family], targets)
    with HFSampler(load_causal_lm(family_dirs[family])) as sampler:
        before = sampler.compute_logprobs(SEQUENCE)
        with pytest.raises(ValueError) as refused:
            sampler.load_lora(adapter, scaling=2.0)
        message = str(refused.value)
        assert "\n" not in message
        assert f"{module!r} is a {kind}" in message
        assert "torch.nn.modules.linear.Linear" in message and "Conv1D" in message
        assert sampler.policy_version == 0
        assert sampler.compute_logprobs(SEQUENCE) == before, "a refused adapter changes nothing"
