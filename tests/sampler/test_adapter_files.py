"""Reading a peft adapter folder for `/v1/load_lora_adapter`: scaling, key layout, clear refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from agl_bridge.sampler.adapter_files import AdapterFileError, read_peft_adapter


def _write(folder: Path, config: dict, tensors: dict[str, torch.Tensor]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    return folder


def test_lora_and_modules_to_save_tensors_come_back_in_the_samplers_layout(tmp_path: Path) -> None:
    a, b, head = torch.ones(4, 8), torch.ones(8, 4), torch.zeros(16, 8)
    folder = _write(
        tmp_path / "v1",
        {"r": 4, "lora_alpha": 8, "modules_to_save": ["lm_head"]},
        {
            "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": a,
            "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": b,
            "base_model.model.lm_head.weight": head,
        },
    )
    state, scaling, saved = read_peft_adapter(folder)
    assert scaling == 2.0 and saved == ["lm_head"]
    assert set(state) == {
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight",
        "base_model.model.lm_head.modules_to_save.default.weight",
    }
    rs = _write(
        tmp_path / "rs", {"r": 4, "lora_alpha": 8, "use_rslora": True}, {"x.lora_A.weight": a, "x.lora_B.weight": b}
    )
    assert read_peft_adapter(rs)[1] == 4.0


def test_a_folder_that_is_not_an_adapter_is_refused_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(AdapterFileError, match="no adapter_config.json"):
        read_peft_adapter(tmp_path)
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8}))
    with pytest.raises(AdapterFileError, match="no adapter_model.safetensors"):
        read_peft_adapter(tmp_path)
    stray = _write(
        tmp_path / "stray", {"r": 4, "lora_alpha": 8}, {"base_model.model.lm_head.weight": torch.zeros(2, 2)}
    )
    with pytest.raises(AdapterFileError, match="neither a LoRA weight nor in modules_to_save"):
        read_peft_adapter(stray)
    (stray / "adapter_model.safetensors").write_bytes(b"damaged")
    with pytest.raises(AdapterFileError, match="cannot read .*adapter_model.safetensors"):
        read_peft_adapter(stray)
    (stray / "adapter_model.safetensors").unlink()
    (stray / "adapter_model.bin").write_bytes(b"damaged")
    with pytest.raises(AdapterFileError, match="cannot read .*adapter_model.bin"):
        read_peft_adapter(stray)
