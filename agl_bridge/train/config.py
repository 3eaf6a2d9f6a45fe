"""The GRPO run's configuration: one dataclass, loaded from TOML, YAML or JSON with strict keys.

Unknown keys are refused by name (a typo must not silently fall back to a default), values are
checked for range, and every field has a default a user of this field would expect.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

import yaml

from agl_bridge.train.schedule import LRSchedule, scheduled_learning_rate

if TYPE_CHECKING:
    from agl_bridge.sampler.factory import SamplerSpec

LossName = Literal["importance_sampling", "ppo", "cispo"]
Aggregation = Literal["token_sum", "token_mean", "sequence_mean"]


class ConfigError(ValueError):
    """A configuration value or key is wrong; the message names it."""


@dataclass
class WarmStartConfig:
    """A supervised warm start (cold-start SFT) before RL: `cross_entropy` on (prompt, response) pairs.

    `data`: JSONL with {"prompt": str or messages, "response": str} per line (or use the Python API
    and pass pairs directly). The run evaluates before and after it.
    """

    data: str | None = None
    steps: int = 0
    batch_size: int = 16
    learning_rate: float = 2e-3


@dataclass
class GRPOConfig:
    """Everything a GRPO run needs; see docs/training.md for each field's meaning."""

    agent: str | list[str] = ""
    tasks: str = ""
    eval_tasks: str | None = None
    offline_data: str | None = None
    model: str = "tiny"
    run_dir: str = "runs/grpo"
    steps: int = 10
    batch_size: int = 8
    group_size: int = 4
    learning_rate: float = 1e-4
    lr_schedule: LRSchedule = "constant"
    lr_warmup_steps: int = 0
    lr_final_ratio: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    weight_decay: float = 0.0
    grad_clip_norm: float = 1.0
    lora_rank: int = 16
    lora_alpha: float = 32.0
    train_unembedding: bool = False
    loss_fn: LossName = "importance_sampling"
    tis_cap: float | None = 2.0
    clip_low_threshold: float = 0.8
    clip_high_threshold: float = 1.28
    kl_coef: float = 0.0
    aggregation: Aggregation = "token_sum"
    advantage_std_scaling: bool = False
    micro_batch_size: int = 16
    max_staleness: int = 0
    concurrency: int = 16
    rollout_timeout_s: float = 300.0
    max_attempts: int = 1
    default_max_tokens: int = 256
    eval_every: int = 5
    eval_group_size: int = 1
    checkpoint_every: int = 5
    missing_reward: Literal["drop", "zero", "error"] = "drop"
    reward_weights: dict[str, float] = field(default_factory=dict)
    seed: int = 0
    tensorboard: bool = True
    wandb_project: str | None = None
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    sampler: str = "hf"
    sampler_urls: list[str] = field(default_factory=list)
    sampler_api_key: str | None = None
    sampler_model: str | None = None
    sampler_timeout_s: float = 600.0
    adapter_dir: str | None = None
    litellm_config: str | None = None

    def validate(self) -> None:
        """Raise ConfigError naming the first value out of range."""
        from agl_bridge.sampler.factory import SamplerSpecError

        try:
            self.sampler_spec().validate()
        except SamplerSpecError as error:
            raise ConfigError(f"{error.field}: {error}") from None
        if self.sampler != "hf" and self.train_unembedding:
            raise ConfigError(
                f"train_unembedding cannot be used with sampler {self.sampler!r}: vLLM loads LoRA weights only, not a "
                'fully trained lm_head; set train_unembedding = false or sampler = "hf"'
            )
        positive = (
            "steps",
            "batch_size",
            "group_size",
            "lora_rank",
            "micro_batch_size",
            "concurrency",
            "max_attempts",
            "default_max_tokens",
            "eval_every",
            "eval_group_size",
            "checkpoint_every",
        )
        for name in positive:
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.max_staleness < 0:
            raise ConfigError(f"max_staleness must be >= 0, got {self.max_staleness}")
        if not self.learning_rate > 0:
            raise ConfigError(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.lr_schedule not in get_args(LRSchedule):
            raise ConfigError(f"lr_schedule must be one of {', '.join(get_args(LRSchedule))}, got {self.lr_schedule!r}")
        if not isinstance(self.lr_warmup_steps, int) or not 0 <= self.lr_warmup_steps < self.steps:
            raise ConfigError(f"lr_warmup_steps must be an integer in [0, steps), got {self.lr_warmup_steps!r}")
        if not 0 <= self.lr_final_ratio <= 1:
            raise ConfigError(f"lr_final_ratio must be in [0, 1], got {self.lr_final_ratio}")
        if self.tis_cap is not None and not self.tis_cap >= 1:
            raise ConfigError(f"tis_cap must be >= 1 (or null to turn the correction off), got {self.tis_cap}")
        if not 0 < self.clip_low_threshold <= 1 <= self.clip_high_threshold:
            raise ConfigError(
                "clip thresholds are ratios with clip_low_threshold <= 1 <= clip_high_threshold (e.g. 0.8 / 1.28)"
            )
        for name, allowed in (("loss_fn", LossName), ("aggregation", Aggregation)):
            if getattr(self, name) not in get_args(allowed):
                raise ConfigError(f"{name} must be one of {', '.join(get_args(allowed))}, got {getattr(self, name)!r}")
        if self.kl_coef < 0:
            raise ConfigError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.warm_start.steps < 0:
            raise ConfigError(f"warm_start.steps must be >= 0, got {self.warm_start.steps}")
        if self.litellm_config is not None:
            from agl_bridge.proxy.server import ProxyStartError, litellm_config

            try:
                litellm_config([], "check", Path(self.litellm_config))
            except ProxyStartError as error:
                raise ConfigError(f"litellm_config: {error}") from None

    def learning_rate_at(self, step: int) -> float:
        """The learning rate of RL step `step` (0-based) under `lr_schedule`; see agl_bridge/train/schedule.py."""
        return scheduled_learning_rate(
            self.learning_rate,
            step,
            self.steps,
            schedule=self.lr_schedule,
            warmup_steps=self.lr_warmup_steps,
            final_ratio=self.lr_final_ratio,
        )

    def sampler_spec(self) -> SamplerSpec:
        """The sampler this run samples with (`sampler`, `sampler_urls`, ... keys)."""
        from agl_bridge.sampler.factory import SamplerSpec, split_urls

        urls = self.sampler_urls
        if not isinstance(urls, (list, str)):
            raise ConfigError(f"sampler_urls must be a list of URLs (or one comma-separated string), got {urls!r}")
        return SamplerSpec(
            kind=self.sampler,
            urls=split_urls(urls),
            api_key=self.sampler_api_key,
            remote_model=self.sampler_model,
            timeout_s=self.sampler_timeout_s,
            adapter_dir=self.adapter_dir or str(Path(self.run_dir) / "adapters"),
            max_batch_size=max(64, self.concurrency),
            seed=self.seed,
        )


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> GRPOConfig:
    """Read a TOML (.toml), YAML (.yaml/.yml) or JSON (.json) config; unknown keys are errors."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(f"cannot read the config {path}: {error.strerror}") from None
    try:
        if path.suffix == ".toml":
            raw = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            raw = yaml.safe_load(text) or {}
        elif path.suffix == ".json":
            raw = json.loads(text)
        else:
            raise ConfigError(f"{path}: use a .toml, .yaml or .json config file")
    except (tomllib.TOMLDecodeError, yaml.YAMLError, json.JSONDecodeError) as error:
        raise ConfigError(f"{path} does not parse: {error}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must hold a mapping of settings")
    merged = {**raw, **(overrides or {})}
    base = path.resolve().parent
    for name in ("tasks", "eval_tasks", "offline_data", "adapter_dir", "litellm_config"):
        value = merged.get(name)
        if isinstance(value, str) and value and not Path(value).is_absolute():
            merged[name] = str(base / value)  # before validation, which may read the file
    return config_from_dict(merged, where=str(path))


def config_from_dict(raw: dict[str, Any], *, where: str = "config") -> GRPOConfig:
    """Build and validate a GRPOConfig from a mapping; unknown keys are refused by name."""
    known = {f.name for f in dataclasses.fields(GRPOConfig)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; known keys: {', '.join(sorted(known))}")
    values = dict(raw)
    _check_types(values, GRPOConfig, where)
    if "warm_start" in values and not isinstance(values["warm_start"], (dict, WarmStartConfig)):
        raise ConfigError(
            f"{where}: warm_start must be a table of settings (data, steps, ...), got {values['warm_start']!r}"
        )
    if isinstance(values.get("warm_start"), dict):
        _check_types(values["warm_start"], WarmStartConfig, f"{where}: warm_start")
        warm = values["warm_start"]
        warm_known = {f.name for f in dataclasses.fields(WarmStartConfig)}
        bad = sorted(set(warm) - warm_known)
        if bad:
            raise ConfigError(f"{where}: unknown key 'warm_start.{bad[0]}'; known: {', '.join(sorted(warm_known))}")
        values["warm_start"] = WarmStartConfig(**warm)
    config = GRPOConfig(**values)
    config.validate()
    return config


_WANTED: dict[str, tuple[str, Any]] = {
    "int": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "float": (
        "a finite number",
        lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
    ),
    "float | None": ("a finite number or null", lambda v: v is None or _WANTED["float"][1](v)),
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "str": ("a string", lambda v: isinstance(v, str)),
    "str | None": ("a string or null", lambda v: v is None or isinstance(v, str)),
    "dict[str, float]": (
        "a table of names to finite numbers",
        lambda v: isinstance(v, dict) and all(isinstance(k, str) and _WANTED["float"][1](x) for k, x in v.items()),
    ),
}


def _check_types(values: dict[str, Any], schema: type, where: str) -> None:
    """Refuse a value of the wrong type by its key, before range checks would fail on it with a TypeError."""
    annotations = {f.name: str(f.type) for f in dataclasses.fields(schema)}
    for name, value in values.items():
        wanted = _WANTED.get(annotations.get(name, ""))
        if wanted is not None and not wanted[1](value):
            raise ConfigError(f"{where}: {name} must be {wanted[0]}, got {value!r}")


def config_to_dict(config: GRPOConfig) -> dict[str, Any]:
    """The config as plain data (saved next to the run for reproducibility)."""
    return dataclasses.asdict(config)
