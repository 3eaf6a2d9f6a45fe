"""Tinker-style training primitives on torch + peft LoRA: datums, losses, the training and sampling clients.

The GRPO loop is built on these; see docs/primitives.md for the API and a custom-loop example.
"""

from __future__ import annotations

from agl_bridge.train.checkpoint import CheckpointMismatchError, ModelIdentity
from agl_bridge.train.client import (
    AdamParams,
    CustomLossFn,
    ForwardBackwardOutput,
    OptimStepOutput,
    TrainFuture,
    TrainingClient,
)
from agl_bridge.train.datum import Datum, DatumError
from agl_bridge.train.losses import LOSSES, LossOutput, LossSpec, dpo_loss, get_loss, kl_k3
from agl_bridge.train.metrics import logprob_gap_stats
from agl_bridge.train.sampling_client import SamplingClient

__all__ = [
    "LOSSES",
    "AdamParams",
    "CheckpointMismatchError",
    "CustomLossFn",
    "Datum",
    "DatumError",
    "ForwardBackwardOutput",
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
