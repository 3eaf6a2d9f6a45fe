"""Architectures the HF sampler cannot serve exactly are refused when it loads, in one line naming the model
type, what is missing, and the alternative (vLLM) — by the sampler and by `agl-bridge serve`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import transformers

from agl_bridge.sampler.hf import HFSampler
from agl_bridge.sampler.kv_batch import UnsupportedArchitectureError

SMALL = {"vocab_size": 512, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2}
ATTENTION = {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16}

UNSERVABLE: dict[str, tuple[Any, str]] = {
    "qwen3_next": (
        transformers.Qwen3NextConfig(
            **SMALL,
            **ATTENTION,
            layer_types=["linear_attention", "full_attention"],
            linear_num_key_heads=1,
            linear_num_value_heads=2,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            num_experts=2,
            num_experts_per_tok=1,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
        ),
        "layer 0 is linear_attention",
    ),
    "mamba": (
        transformers.MambaConfig(vocab_size=512, hidden_size=32, num_hidden_layers=2, state_size=4),
        "MambaForCausalLM.forward takes no past_key_values",
    ),
    "llama4_text": (
        transformers.Llama4TextConfig(
            **SMALL, **ATTENTION, intermediate_size_mlp=64, num_local_experts=2, attention_chunk_size=8
        ),
        "layers 0, 1 are chunked_attention",
    ),
    "gemma2": (
        transformers.Gemma2Config(
            **SMALL, **ATTENTION, sliding_window=None, layer_types=["sliding_attention", "full_attention"]
        ),
        "config.json gives no usable sliding_window (None)",
    ),
}


def _refusal(error: BaseException, model_type: str) -> str:
    message = str(error)
    assert "\n" not in message
    assert f"model type {model_type!r} cannot be served by the HF sampler" in message
    assert message.endswith("serve it with vLLM: --sampler remote (docs/remote.md)")
    return message


@pytest.mark.parametrize("model_type", list(UNSERVABLE))
def test_unservable_architectures_are_refused_at_load(model_type: str) -> None:
    config, missing = UNSERVABLE[model_type]
    model = transformers.AutoModelForCausalLM.from_config(config)
    with pytest.raises(UnsupportedArchitectureError) as refused:
        HFSampler(model)
    assert missing in _refusal(refused.value, model_type)
    assert refused.value.model_type == model_type


@pytest.mark.slow
def test_serve_refuses_an_unservable_checkpoint_in_one_line(
    tmp_path: Path, tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from agl_bridge.cli import app

    checkpoint = tmp_path / "qwen3-next"
    config, _ = UNSERVABLE["qwen3_next"]
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(checkpoint)
    tiny_tokenizer.save_pretrained(checkpoint)
    monkeypatch.setenv("AGL_API_KEY", "test-key")
    result = CliRunner().invoke(
        app, ["serve", "--model", str(checkpoint), "--store", str(tmp_path / "store.sqlite"), "--port", "0"]
    )
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"Error: cannot load model {str(checkpoint)!r}: ")
    _refusal(lines[0].split(": ", 2)[2], "qwen3_next")
