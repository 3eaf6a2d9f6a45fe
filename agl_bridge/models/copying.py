"""Teach a random model to copy before anything else: a short pre-training on repeated random token runs.

A task whose answer is a word of the prompt the model never saw in training (a held-out name in a
candidate list, an argument taken from a tool's result) needs induction heads: attention that finds
the earlier occurrence of the current token and copies what followed it. A random 2-layer tiny model
forms them only after a phase change: on runs of 48 random tokens repeated once, the loss on the
repeat stayed at ln(vocab) for ~600 full-weight steps, then fell to 0.03 by step 800 (about 3 minutes
on one CPU thread). `pretrain_copying` runs that pre-training once and caches the result as an
ordinary model directory, the base that a warm start and RL then train.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from agl_bridge.models.loading import cache_dir, load_causal_lm, resolve_model_path

MARKER_FILENAME = "agl_bridge_copying.json"
"""Written last into a finished copy pre-training: its settings and the loss on the repeats."""


@dataclass(frozen=True)
class CopyPretraining:
    """The pre-training's settings: `steps` AdamW steps of `batch_size` runs of `length` random tokens, each
    run followed by itself; the loss counts only the repeat."""

    steps: int = 900
    batch_size: int = 32
    length: int = 48
    learning_rate: float = 1e-3
    seed: int = 0

    def key(self, base: str) -> str:
        """A short name for this pre-training of `base` (the cache folder's)."""
        import hashlib

        payload = json.dumps({"base": base, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def pretrain_copying(model: str = "tiny", settings: CopyPretraining | None = None) -> Path:
    """The directory of `model` pre-trained to copy (built on first use, then cached under agl_bridge's cache).

    The base is resolved like any `--model` value; tokenizer and chat template are the base's. Built into a
    private folder and renamed into place, so concurrent callers never see half a model.
    """
    import torch

    settings = settings or CopyPretraining()
    base = resolve_model_path(model)
    final = cache_dir() / "models" / f"copying-{settings.key(base)}"
    if (final / MARKER_FILENAME).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = final.parent / f".{final.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    generator = torch.Generator().manual_seed(settings.seed)
    network = load_causal_lm(base)
    network.train()
    optimizer = torch.optim.AdamW(network.parameters(), lr=settings.learning_rate)
    low = 16  # past the control and markup tokens, so the runs are ordinary text tokens
    high = network.config.vocab_size - 16
    loss = torch.tensor(float("nan"))
    for _ in range(settings.steps):
        run = torch.randint(low, high, (settings.batch_size, settings.length), generator=generator)
        ids = torch.cat([run, run], dim=1)
        labels = ids.clone()
        labels[:, : settings.length + 1] = -100  # the first token of the repeat cannot be predicted
        loss = network(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(network.parameters(), 1.0)
        optimizer.step()
    try:
        shutil.copytree(base, staging, ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "agl_bridge_*.json"))
        network.save_pretrained(staging)
        marker = {"base": base, **asdict(settings), "repeat_loss": round(loss.item(), 4)}
        (staging / MARKER_FILENAME).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
        try:
            staging.rename(final)
        except OSError:
            if not (final / MARKER_FILENAME).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final
