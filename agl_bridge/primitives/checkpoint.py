"""Training-state checkpoints: adapter, optimizer, step, RNG states and the model's identity.

A state directory holds:

* ``adapter_model.safetensors`` + ``adapter_config.json`` — the LoRA adapter in peft's layout (the
  directory also loads with ``PeftModel.from_pretrained``); a full-weight client's weights, by
  name, and no adapter config;
* ``optimizer.pt`` — the AdamW state dict;
* ``rng.pt`` — python, numpy and torch (CPU and CUDA) RNG states;
* ``trainer_state.json`` — format version, step, and the identity of the base model and LoRA
  config, written last.

Directories are written to a temporary sibling and renamed into place, so a crash never leaves a
half-written state under the final name.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

logger = logging.getLogger(__name__)

STATE_FORMAT = 1
"""Version of the state-directory layout; bumped on incompatible changes."""

STATE_FILE = "trainer_state.json"
ADAPTER_FILE = "adapter_model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
RNG_FILE = "rng.pt"

# Config keys that describe how a checkpoint was saved or loaded, not what the model computes.
# Tying is one: an untied copy of the same weights (a sampler for a trained lm_head) is the same model.
_VOLATILE_CONFIG_KEYS = {
    "_name_or_path",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "use_cache",
    "architectures",
    "tie_word_embeddings",
}
# Elements sampled from each hashed tensor: enough to tell checkpoints apart, cheap for 100 GB ones.
_HASH_ELEMENTS = 1 << 16


class CheckpointMismatchError(ValueError):
    """A saved state belongs to another base model or LoRA config; `field` names what differs."""

    def __init__(self, field: str, saved: Any, current: Any) -> None:
        super().__init__(
            f"the saved state does not match this training client: {field} is {saved!r} in the checkpoint "
            f"but {current!r} here. Create the TrainingClient with the same base model and LoRA settings "
            f"the state was saved with (see {STATE_FILE} in the state directory)"
        )
        self.field = field
        self.saved = saved
        self.current = current


@dataclass(frozen=True)
class ModelIdentity:
    """What a training state is only valid for: the base model's weights/config and the LoRA setup.

    base_model: the resolved path or hub id (informational: a moved copy of the same model loads).
    config_fingerprint: sha256 of the model config, without keys about how it was stored.
    weights_hash: sha256 of samples of a few base tensors, rounded to bfloat16 so one checkpoint
      loaded as float32 or bfloat16 hashes the same.
    lora_rank, lora_alpha, target_modules (the adapted module names), train_unembedding: the adapter.
    """

    base_model: str
    config_fingerprint: str
    weights_hash: str
    lora_rank: int
    lora_alpha: float
    target_modules: tuple[str, ...]
    train_unembedding: bool

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        data = asdict(self)
        data["target_modules"] = list(self.target_modules)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelIdentity:
        """Inverse of to_json."""
        return cls(**{**data, "target_modules": tuple(data["target_modules"])})

    def check_compatible(self, saved: ModelIdentity) -> None:
        """Raise CheckpointMismatchError for the first field (other than the path) that differs."""
        for name in ("config_fingerprint", "weights_hash", "lora_rank", "lora_alpha", "train_unembedding"):
            if getattr(saved, name) != getattr(self, name):
                raise CheckpointMismatchError(name, getattr(saved, name), getattr(self, name))
        if saved.target_modules != self.target_modules:
            only_saved = sorted(set(saved.target_modules) - set(self.target_modules))
            only_here = sorted(set(self.target_modules) - set(saved.target_modules))
            raise CheckpointMismatchError(
                "target_modules",
                f"{len(saved.target_modules)} modules, e.g. only there: {only_saved[:3]}",
                f"{len(self.target_modules)} modules, e.g. only here: {only_here[:3]}",
            )
        if saved.base_model != self.base_model:
            logger.warning(
                "loading a state saved for base model %s into a client on %s: same config and weights, "
                "so it is taken as the same model",
                saved.base_model,
                self.base_model,
            )


def config_fingerprint(config: Any) -> str:
    """sha256 of a transformers config's dict, without private and storage-related keys."""
    data = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    kept = {k: v for k, v in data.items() if not k.startswith("_") and k not in _VOLATILE_CONFIG_KEYS}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()


def weights_hash(named_tensors: Mapping[str, torch.Tensor]) -> str:
    """sha256 over the names, shapes and strided samples of the first, middle and last tensor by name."""
    names = sorted(named_tensors)
    if not names:
        return hashlib.sha256(b"").hexdigest()
    picked = sorted({names[0], names[len(names) // 2], names[-1]})
    digest = hashlib.sha256()
    for name in picked:
        flat = named_tensors[name].detach().reshape(-1)
        stride = max(1, flat.numel() // _HASH_ELEMENTS)
        sample = flat[::stride][:_HASH_ELEMENTS].to("cpu", torch.bfloat16).contiguous()
        digest.update(f"{name}:{tuple(named_tensors[name].shape)}:".encode())
        digest.update(sample.view(torch.int16).numpy().tobytes())
    return digest.hexdigest()


def capture_rng_state() -> dict[str, Any]:
    """The python, numpy and torch (CPU, every CUDA device) global RNG states, as tensors and lists."""
    version, mt_state, gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": {"version": version, "state": torch.tensor(mt_state, dtype=torch.int64), "gauss": gauss},
        "numpy": {
            "name": np_name,
            "keys": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "gauss": float(np_gauss),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Set the global RNGs from `capture_rng_state` output."""
    py = state["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["state"].tolist()), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state(
        (npy["name"], npy["keys"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"], npy["gauss"])
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
        else:
            logger.warning(
                "not restoring CUDA RNG states: saved for %d devices, %d here",
                len(cuda_states),
                torch.cuda.device_count(),
            )


@contextmanager
def atomic_directory(path: str | os.PathLike[str], markers: tuple[str, ...] = (STATE_FILE,)) -> Iterator[Path]:
    """Yield a temporary directory that replaces `path` when the block succeeds, or vanishes if it fails.

    An existing `path` is only replaced if it is empty or holds one of the `markers` files (what
    this kind of save writes), so a typo cannot delete an unrelated directory.
    """
    final = Path(path)
    if final.exists() and not (
        final.is_dir() and (any((final / m).is_file() for m in markers) or not any(final.iterdir()))
    ):
        raise FileExistsError(
            f"{final} exists and is not a directory this save wrote (no {' or '.join(markers)}); "
            "refusing to overwrite it. Choose another path or remove it first"
        )
    final.parent.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    staging = final.parent / f".{final.name}.tmp-{tag}"
    staging.mkdir()
    try:
        yield staging
        for item in staging.iterdir():
            _fsync(item)
        if final.exists():
            # rename() cannot replace a non-empty directory: move the old one aside first.
            retired = final.parent / f".{final.name}.old-{tag}"
            os.rename(final, retired)
            os.rename(staging, final)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.rename(staging, final)
        _fsync(final.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write `data` as indented JSON."""
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def read_state_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The trainer_state.json of a state directory, with errors that say what is missing."""
    directory = Path(path)
    meta_path = directory / STATE_FILE
    if not meta_path.is_file():
        what = "does not exist" if not directory.exists() else f"has no {STATE_FILE}"
        raise FileNotFoundError(f"{directory} {what}; pass a directory written by TrainingClient.save_state")
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != STATE_FORMAT:
        raise CheckpointMismatchError("format", meta.get("format"), STATE_FORMAT)
    for name in (ADAPTER_FILE, OPTIMIZER_FILE, RNG_FILE):
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{directory} has {STATE_FILE} but no {name}; the state is incomplete")
    return meta


@dataclass
class LoadedState:
    """A state directory read and checked, not yet applied: the adapter, and with the optimizer asked
    for, its state, the RNG states and the step."""

    adapter: dict[str, torch.Tensor]
    optimizer_state: dict[str, Any] | None
    rng_state: dict[str, Any] | None
    step: int


def save_adapter_directory(path: str | os.PathLike[str], adapter: Mapping[str, torch.Tensor], peft_config: Any) -> str:
    """Write a LoRA adapter as a peft directory (weights + adapter_config.json), atomically."""
    with atomic_directory(path, markers=("adapter_config.json",)) as staging:
        _write_adapter(staging, adapter, peft_config)
    return str(path)


def save_model_directory(path: str | os.PathLike[str], model: Any, weights: Mapping[str, torch.Tensor]) -> str:
    """Write fully trained `weights` as a model directory of `model`'s architecture (what
    `from_pretrained` and vLLM load), atomically."""
    with atomic_directory(path, markers=("config.json",)) as staging:
        model.save_pretrained(str(staging), state_dict=dict(weights))
    return str(path)


def save_state_directory(
    path: str | os.PathLike[str],
    *,
    adapter: Mapping[str, torch.Tensor],
    peft_config: Any,
    optimizer_state: Mapping[str, Any],
    step: int,
    identity: ModelIdentity,
) -> str:
    """Write a training state directory (see the module docs) atomically; trainer_state.json last."""
    with atomic_directory(path) as staging:
        _write_adapter(staging, adapter, peft_config)
        torch.save(dict(optimizer_state), staging / OPTIMIZER_FILE)
        torch.save(capture_rng_state(), staging / RNG_FILE)
        write_json(
            staging / STATE_FILE,
            {"format": STATE_FORMAT, "step": step, "identity": identity.to_json(), "saved_at": time.time()},
        )
    return str(path)


def read_state_directory(
    path: str | os.PathLike[str],
    identity: ModelIdentity,
    adapter_keys: set[str],
    device: torch.device,
    *,
    optimizer: bool = True,
) -> LoadedState:
    """Read a state directory for a client of `identity` whose adapter has `adapter_keys`; a state of
    another model or LoRA is refused (`CheckpointMismatchError`) before anything is returned."""
    directory = Path(path)
    meta = read_state_meta(directory)
    identity.check_compatible(ModelIdentity.from_json(meta["identity"]))
    adapter = load_file(str(directory / ADAPTER_FILE), device=str(device))
    if set(adapter) != adapter_keys:
        missing, unexpected = sorted(adapter_keys - set(adapter)), sorted(set(adapter) - adapter_keys)
        raise CheckpointMismatchError("adapter_keys", f"missing {missing[:3]}", f"unexpected {unexpected[:3]}")
    if not optimizer:
        return LoadedState(adapter, None, None, int(meta["step"]))
    return LoadedState(
        adapter,
        torch.load(directory / OPTIMIZER_FILE, map_location=device, weights_only=True),
        torch.load(directory / RNG_FILE, weights_only=True),
        int(meta["step"]),
    )


def _write_adapter(directory: Path, adapter: Mapping[str, torch.Tensor], peft_config: Any) -> None:
    save_file(dict(adapter), str(directory / ADAPTER_FILE), metadata={"format": "pt"})
    if peft_config is not None:  # None: full weights, no adapter config
        peft_config.save_pretrained(str(directory))


def _fsync(path: Path) -> None:
    flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
