"""The Tinker-shaped training primitives on torch + peft LoRA: datums, losses, rollout correction,
advantages, the training and sampling clients, checkpoints of weights and optimizer.

This layer knows nothing of the proxy, the runner, the converter or the store: a custom loop (see
docs/primitives.md) and the training modes of `agl_bridge.train` are built on it. The names below
are imported on first use, so `agl_bridge.primitives.advantages` (pure Python) loads without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agl_bridge.primitives.checkpoint import CheckpointMismatchError, ModelIdentity
    from agl_bridge.primitives.client import (
        AdamParams,
        CustomLossFn,
        ForwardBackwardOutput,
        OptimStepOutput,
        TrainFuture,
        TrainingClient,
    )
    from agl_bridge.primitives.datum import Datum, DatumError
    from agl_bridge.primitives.losses import LOSSES, LossOutput, LossSpec, dpo_loss, get_loss, kl_k3
    from agl_bridge.primitives.metrics import logprob_gap_stats
    from agl_bridge.primitives.sampling_client import SamplingClient

_MODULE_OF = {
    "CheckpointMismatchError": "checkpoint",
    "ModelIdentity": "checkpoint",
    "AdamParams": "client",
    "CustomLossFn": "client",
    "ForwardBackwardOutput": "client",
    "OptimStepOutput": "client",
    "TrainFuture": "client",
    "TrainingClient": "client",
    "Datum": "datum",
    "DatumError": "datum",
    "LOSSES": "losses",
    "LossOutput": "losses",
    "LossSpec": "losses",
    "dpo_loss": "losses",
    "get_loss": "losses",
    "kl_k3": "losses",
    "logprob_gap_stats": "metrics",
    "SamplingClient": "sampling_client",
}


def __getattr__(name: str) -> object:
    """The public names of the layer, each from its module (imported on first use)."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "AdamParams",
    "CheckpointMismatchError",
    "CustomLossFn",
    "Datum",
    "DatumError",
    "ForwardBackwardOutput",
    "LOSSES",
    "LossOutput",
    "LossSpec",
    "ModelIdentity",
    "OptimStepOutput",
    "SamplingClient",
    "TrainFuture",
    "TrainingClient",
    "dpo_loss",
    "get_loss",
    "kl_k3",
    "logprob_gap_stats",
]
