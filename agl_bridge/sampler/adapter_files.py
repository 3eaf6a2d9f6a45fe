"""Reading a peft LoRA adapter folder (what `save_pretrained` / `save_weights_for_sampler` writes).

The layout vLLM's `/v1/load_lora_adapter` reads too: `adapter_config.json` (r, lora_alpha,
use_rslora, modules_to_save) and `adapter_model.safetensors` (or `adapter_model.bin`). The tensors
come back in the layout `HFSampler.load_lora` merges, with the scaling peft would apply.
"""

from __future__ import annotations

import json
import math
import os
import pickle
from pathlib import Path

import torch

from agl_bridge.sampler.weights import PEFT_PREFIX


class AdapterFileError(ValueError):
    """An adapter folder is missing, incomplete or not a LoRA adapter; the message says which file."""


def read_peft_adapter(path: str | os.PathLike[str]) -> tuple[dict[str, torch.Tensor], float, list[str]]:
    """(state dict for `HFSampler.load_lora`, scaling, modules_to_save) of the adapter in `path`."""
    folder = Path(path)
    config_file = folder / "adapter_config.json"
    try:
        config = json.loads(config_file.read_text())
    except FileNotFoundError:
        raise AdapterFileError(
            f"no adapter_config.json in {folder}: pass the folder a peft adapter was saved to"
        ) from None
    except (OSError, ValueError) as error:
        raise AdapterFileError(f"cannot read {config_file}: {error}") from None
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or rank < 1 or not isinstance(alpha, (int, float)):
        raise AdapterFileError(f"{config_file} needs an integer r >= 1 and a number lora_alpha (a peft LoRA config)")
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    saved = [m.rsplit(".", 1)[-1] for m in config.get("modules_to_save") or []]
    raw = _read_tensors(folder)
    state: dict[str, torch.Tensor] = {}
    for key, value in raw.items():
        if ".lora_A." in key or ".lora_B." in key:
            state[key] = value
            continue
        module = key.removeprefix(PEFT_PREFIX).rsplit(".", 1)[0]
        if module.rsplit(".", 1)[-1] not in saved:
            raise AdapterFileError(f"{folder}: tensor {key!r} is neither a LoRA weight nor in modules_to_save {saved}")
        # peft saves a modules_to_save copy under the module's own name; load_lora takes it in its
        # in-model layout.
        head, _, param = key.rpartition(".")
        state[f"{head}.modules_to_save.default.{param}"] = value
    if not state:
        raise AdapterFileError(f"{folder} holds no LoRA tensors")
    return state, float(scaling), saved


def _read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    safetensors_file, bin_file = folder / "adapter_model.safetensors", folder / "adapter_model.bin"
    # A damaged file is the caller's to fix (a refusal naming it), not a server error that clients retry.
    if safetensors_file.is_file():
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(safetensors_file))
        except (SafetensorError, OSError) as error:
            raise AdapterFileError(f"cannot read {safetensors_file}: {error}") from None
    if bin_file.is_file():
        try:
            return torch.load(bin_file, map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, EOFError, OSError, RuntimeError) as error:
            raise AdapterFileError(f"cannot read {bin_file}: {error}") from None
    raise AdapterFileError(f"no adapter_model.safetensors (or adapter_model.bin) in {folder}")
