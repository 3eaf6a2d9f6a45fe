"""One optimizer step, the same in every training mode: forward_backward over the batch, then optim_step.

`TrainingClient.forward_backward` splits the batch into micro-batches of at most `max_batch_tokens`
padded tokens (the one knob that bounds memory) and adds up their gradients; `train_step` takes one
AdamW step on the sum and returns the metrics a run logs. Online GRPO, offline GRPO and the
supervised warm start differ only in their datums and their `StepSettings`; DPO takes the same step
with its custom loss.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from typing import Any

from agl_bridge.errors import ConfigError
from agl_bridge.primitives.client import AdamParams, CustomLossFn, TrainingClient
from agl_bridge.primitives.data_parallel import (
    DataParallelTrainingClient,
    RankGroup,
    join_group_from_env,
    launched_rank,
    spawn_local_group,
)
from agl_bridge.primitives.datum import Datum
from agl_bridge.sampler.base import AdapterSampler
from agl_bridge.sampler.hf import HFSampler
from agl_bridge.sampler.hf_process import HFProcessSampler
from agl_bridge.train.config import GRPOConfig

TRAIN_KEYS = ("loss", "grad_norm", "lr", "ratio_mean", "logprob_diff_abs_mean", "logprob_diff_abs_max", "entropy_mean")
"""The step metrics a record keeps (as None) when there was nothing to train."""


@dataclass(frozen=True)
class StepSettings:
    """What one step optimises and how: the loss (a built-in's name, or a custom loss function for
    `forward_backward_custom`), its settings, and the AdamW hyper-parameters."""

    loss_fn: str | CustomLossFn
    loss_config: dict[str, Any] | None
    adam: AdamParams

    def at_learning_rate(self, learning_rate: float) -> StepSettings:
        """The same step at another learning rate (a schedule's rate for one step)."""
        return replace(self, adam=replace(self.adam, learning_rate=learning_rate))


def grpo_settings(config: GRPOConfig) -> StepSettings:
    """The GRPO step of a run config: its loss with the clip ratios and the rollout correction.

    importance_sampling always takes the correction keys (token TIS at `tis_cap` by default); the
    clipped losses (ppo, cispo, gspo) take them only with `rollout_correction` set (decoupled mode),
    else their ratio against the sampler is the correction (bypass mode).
    """
    loss_config: dict[str, Any] = {"kl_coef": config.kl_coef}
    if config.loss_fn == "importance_sampling" or config.rollout_correction is not None:
        if config.rollout_correction is not None:
            loss_config["correction_level"] = config.rollout_correction
        if config.tis_cap is not None:
            loss_config["tis_cap"] = config.tis_cap
        loss_config |= config.masking_keys()
    if config.loss_fn in ("ppo", "cispo", "gspo"):
        low, high = config.clip_thresholds()
        loss_config |= {"clip_low_threshold": low, "clip_high_threshold": high}
    return StepSettings(config.loss_fn, loss_config, adam_params(config))


def adam_params(config: GRPOConfig) -> AdamParams:
    """The AdamW hyper-parameters of a run config."""
    return AdamParams(
        learning_rate=config.learning_rate,
        beta1=config.beta1,
        beta2=config.beta2,
        weight_decay=config.weight_decay,
        grad_clip_norm=config.grad_clip_norm,
    )


def run_client(
    config: GRPOConfig, model_path: str, sampler: HFSampler | HFProcessSampler | AdapterSampler | None = None
) -> TrainingClient:
    """The TrainingClient of a run config (its LoRA, seed and memory bound), publishing to `sampler` if given.

    With `trainer_ranks` > 1 it drives a data-parallel group (docs/scaling.md): the ranks a launcher
    (torchrun) started, or workers it starts — processes on this machine, or Ray tasks.
    """
    settings: dict[str, Any] = {
        "base_model": model_path,
        "lora_rank": config.lora_rank,
        "lora_alpha": config.lora_alpha,
        "target_modules": config.lora_target_modules,
        "train_unembedding": config.train_unembedding,
        "full_weights": config.train_full_weights,
        "seed": config.seed,
        "sampler": sampler,
        "max_batch_tokens": config.max_batch_tokens,
    }
    if config.trainer_ranks == 1 and launched_rank() is None:
        return TrainingClient(**settings)
    return DataParallelTrainingClient(
        rank_group(config), sharding=config.trainer_sharding, config_digest=config.digest(), **settings
    )


def rank_group(config: GRPOConfig) -> RankGroup:
    """The data-parallel group of a run: joined from a launcher's environment (its size must be
    `trainer_ranks`), else `trainer_ranks` ranks started as `trainer_launch` says."""
    if launched_rank() is None:
        if config.trainer_launch == "ray":
            from agl_bridge.train.ray_ranks import ray_rank_group

            return ray_rank_group(
                config.trainer_ranks, timeout_s=config.trainer_timeout_s, ray_address=config.ray_address
            )
        return spawn_local_group(config.trainer_ranks, timeout_s=config.trainer_timeout_s)
    world_size = int(os.environ["WORLD_SIZE"])
    if world_size != config.trainer_ranks:
        raise ConfigError(
            f"the launcher started {world_size} ranks but trainer_ranks is {config.trainer_ranks}; "
            f"set trainer_ranks = {world_size} or start {config.trainer_ranks} (torchrun --nproc-per-node)"
        )
    if config.trainer_launch != "processes":
        raise ConfigError(
            f'trainer_launch = "{config.trainer_launch}" but a launcher (torchrun) started the ranks; '
            "remove trainer_launch when launching with torchrun"
        )
    return join_group_from_env(timeout_s=config.trainer_timeout_s)


async def train_step(client: TrainingClient, datums: list[Datum], settings: StepSettings) -> dict[str, Any]:
    """forward_backward over `datums`, then one optim_step; their metrics plus the compute time.

    No datums (every group had equal returns): nothing to learn, no step; the record keeps its keys.
    """
    if not datums:
        return {key: None for key in TRAIN_KEYS} | {"trained_tokens": 0, "time_forward_backward_s": 0.0}
    began = time.perf_counter()
    if isinstance(settings.loss_fn, str):
        output = await client.forward_backward_async(datums, settings.loss_fn, settings.loss_config)
    else:
        output = await client.forward_backward_custom_async(datums, settings.loss_fn)
    optim = await client.optim_step_async(settings.adam)
    compute = time.perf_counter() - began
    metrics: dict[str, Any] = {key: value for key, value in output.metrics.items() if key != "time_s"}
    metrics.update({("optimizer_step" if key == "step" else key): value for key, value in optim.metrics.items()})
    metrics["trained_tokens"] = sum(1 for d in datums for w in d.loss_fn_inputs["weights"] if w)
    metrics["time_forward_backward_s"] = round(compute, 4)
    return metrics
