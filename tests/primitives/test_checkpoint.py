"""save_state / load_state: exact resume, RNG states, refusal of other models or LoRA configs, atomicity."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from datum_helpers import rl_batch
from safetensors.torch import load_file, save_file

from agl_bridge.primitives import AdamParams, CheckpointMismatchError

ADAM = AdamParams(learning_rate=1e-2)


def _train(client, data, steps: int) -> None:
    for _ in range(steps):
        client.forward_backward(data, "importance_sampling", {"tis_cap": 2.0})
        client.optim_step(ADAM)


def test_resumed_run_matches_an_uninterrupted_one(make_client, tmp_path: Path) -> None:
    straight = make_client()
    data = rl_batch(straight, count=3)
    _train(straight, data, 2)
    straight.save_state(tmp_path / "step2")
    loss3 = straight.forward_backward(data, "importance_sampling", {"tis_cap": 2.0}).metrics["loss"]
    straight.optim_step(ADAM)
    # The loss after step 3 depends on Adam's moments too, not only on the adapter weights.
    loss4 = straight.forward(data, "importance_sampling").metrics["loss"]

    resumed = make_client(seed=123)  # another LoRA init: only a real load can make it match
    assert resumed.load_state(tmp_path / "step2") == 2
    assert resumed.step == 2
    resumed_loss3 = resumed.forward_backward(data, "importance_sampling", {"tis_cap": 2.0}).metrics["loss"]
    resumed.optim_step(ADAM)
    assert resumed_loss3 == pytest.approx(loss3, abs=1e-6)
    assert resumed.forward(data, "importance_sampling").metrics["loss"] == pytest.approx(loss4, abs=1e-6)
    assert resumed.step == straight.step == 3


def test_load_state_restores_the_global_rng_states(make_client, tmp_path: Path) -> None:
    client = make_client()
    torch.manual_seed(1), random.seed(1), np.random.seed(1)
    client.save_state(tmp_path / "state")
    expected = (torch.rand(3).tolist(), random.random(), float(np.random.rand()))
    torch.rand(5), random.random(), np.random.rand()
    client.load_state(tmp_path / "state")
    assert (torch.rand(3).tolist(), random.random(), float(np.random.rand())) == expected


def test_state_directory_is_a_peft_adapter_and_names_the_model(make_client, tmp_path: Path) -> None:
    client = make_client()
    client.save_state(tmp_path / "state")
    meta = json.loads((tmp_path / "state" / "trainer_state.json").read_text())
    assert meta["step"] == 0
    identity = meta["identity"]
    assert identity["base_model"] == client.base_model
    assert identity["lora_rank"] == 8 and identity["lora_alpha"] == 32.0
    assert "model.layers.0.self_attn.q_proj" in identity["target_modules"]
    assert (tmp_path / "state" / "adapter_config.json").is_file()
    assert len(load_file(tmp_path / "state" / "adapter_model.safetensors")) == 2 * len(identity["target_modules"])


def test_other_lora_config_is_refused_and_the_client_is_untouched(make_client, tmp_path: Path) -> None:
    saver = make_client(lora_rank=8)
    saver.save_state(tmp_path / "r8")
    other = make_client(lora_rank=4)
    before = [p.detach().clone() for p in other.trainable_parameters()]
    with pytest.raises(CheckpointMismatchError, match="lora_rank is 8 in the checkpoint but 4 here") as info:
        other.load_state(tmp_path / "r8")
    assert info.value.field == "lora_rank"
    assert other.step == 0
    assert all(torch.equal(a, b) for a, b in zip(before, other.trainable_parameters(), strict=True))

    with pytest.raises(CheckpointMismatchError) as info:
        make_client(lora_alpha=16).load_state(tmp_path / "r8")
    assert info.value.field == "lora_alpha"
    with pytest.raises(CheckpointMismatchError) as info:
        make_client(target_modules=["q_proj", "v_proj"]).load_state(tmp_path / "r8")
    assert info.value.field == "target_modules"
    with pytest.raises(CheckpointMismatchError) as info:
        make_client(train_unembedding=True).load_state(tmp_path / "r8")
    assert info.value.field == "train_unembedding"


def _copy_model(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def test_other_base_weights_are_refused(make_client, tiny_model_dir: Path, tmp_path: Path) -> None:
    make_client().save_state(tmp_path / "state")
    changed = _copy_model(tiny_model_dir, tmp_path / "changed_weights")
    weights = load_file(changed / "model.safetensors")
    weights["model.embed_tokens.weight"] = weights["model.embed_tokens.weight"] * 1.01
    save_file(weights, changed / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointMismatchError) as info:
        make_client(base_model=changed).load_state(tmp_path / "state")
    assert info.value.field == "weights_hash"


def test_other_base_config_is_refused_but_a_moved_copy_loads(make_client, tiny_model_dir: Path, tmp_path: Path) -> None:
    make_client().save_state(tmp_path / "state")
    changed = _copy_model(tiny_model_dir, tmp_path / "changed_config")
    config = json.loads((changed / "config.json").read_text())
    config["rms_norm_eps"] = 1e-5
    (changed / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointMismatchError) as info:
        make_client(base_model=changed).load_state(tmp_path / "state")
    assert info.value.field == "config_fingerprint"

    moved = _copy_model(tiny_model_dir, tmp_path / "moved")
    assert make_client(base_model=moved).load_state(tmp_path / "state") == 0


def test_saves_are_atomic_and_never_clobber_foreign_directories(make_client, tmp_path: Path) -> None:
    client = make_client()
    data = rl_batch(client, count=1)
    client.save_state(tmp_path / "latest")
    _train(client, data, 1)
    client.save_state(tmp_path / "latest")  # replacing an older state is fine
    assert json.loads((tmp_path / "latest" / "trainer_state.json").read_text())["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest"]  # no temporary directories left

    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        client.save_state(foreign)
    assert (foreign / "keep.txt").read_text() == "mine"
    with pytest.raises(FileNotFoundError, match="save_state"):
        client.load_state(tmp_path / "missing")


@pytest.mark.filterwarnings("ignore::FutureWarning")  # transformers deprecation inside peft loading
def test_save_weights_for_sampler_writes_a_loadable_peft_adapter(
    make_client, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    client = make_client()
    data = rl_batch(client, count=2)
    _train(client, data, 1)
    client.save_weights_for_sampler(tmp_path / "adapter")
    peft_model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), tmp_path / "adapter"
    ).eval()
    ids = torch.tensor([data[0].model_input])
    with torch.no_grad():
        expected = client.model(input_ids=ids).logits
        torch.testing.assert_close(peft_model(input_ids=ids).logits, expected, rtol=1e-5, atol=1e-5)
