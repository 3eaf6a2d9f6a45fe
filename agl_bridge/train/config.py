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
from typing import Any, Literal, get_args

import yaml

from agl_bridge.errors import ConfigError
from agl_bridge.sampler.factory import SamplerSpec, SamplerSpecError
from agl_bridge.store.location import is_postgres_location
from agl_bridge.train.client import DEFAULT_MAX_BATCH_TOKENS

LossName = Literal["importance_sampling", "ppo", "cispo"]
Aggregation = Literal["token_sum", "token_mean", "sequence_mean"]


REMOVED_KEYS = {
    "micro_batch_size": "max_batch_tokens (the most padded tokens per forward pass: each step's batch is split by "
    "tokens, which is what bounds memory)",
}
"""Keys earlier versions took, with what replaces each; a config that still sets one is refused by name."""


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
class FollowConfig:
    """The follow mode (`mode = "follow"`): the trainer runs no agent; an outside harness sends rollouts.

    Groups: the rollouts of one task (the `task_id` the harness names) form a GRPO group; a group
    is complete once `group_size` of its rollouts finished, or, with `group_timeout_s`, once that
    long has passed since its first finished with at least `min_group_size` finished. Each step
    takes `batch_size` complete groups.
    store: attach to the store an existing `agl-bridge serve` records into (its weights then go to
      that server: `sampler = "remote"`, `sampler_urls = [its URL]`); unset: the trainer serves the
      proxy itself on host:port, recording into run_dir/store.sqlite.
    rollout_idle_timeout_s: when the trainer serves, time out rollouts nobody finishes.
    wait_report_s: how often a trainer that waits says so (and what it has).
    """

    store: str | None = None
    host: str = "127.0.0.1"
    port: int = 4000
    api_key: str | None = None
    min_group_size: int = 2
    group_timeout_s: float | None = None
    rollout_idle_timeout_s: float | None = None
    wait_report_s: float = 30.0


@dataclass
class GRPOConfig:
    """Everything a GRPO run needs; see docs/training.md for each field's meaning."""

    mode: Literal["online", "follow"] = "online"
    agent: str | list[str] = ""
    tasks: str = ""
    eval_tasks: str | None = None
    offline_data: str | None = None
    model: str = "tiny"
    run_dir: str = "runs/grpo"
    store: str | None = None
    steps: int = 10
    batch_size: int = 8
    group_size: int = 4
    learning_rate: float = 1e-4
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
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
    max_staleness: int = 0
    concurrency: int = 16
    runner: Literal["local", "ray"] = "local"
    ray_address: str | None = None
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
    follow: FollowConfig = field(default_factory=FollowConfig)
    # The sampler keys: SamplerSpec describes them (defaults, checks, help); sampler_spec() maps them onto it.
    sampler: str = SamplerSpec.kind
    sampler_urls: list[str] = field(default_factory=list)
    sampler_api_key: str | None = SamplerSpec.api_key
    sampler_model: str | None = SamplerSpec.remote_model
    sampler_timeout_s: float = SamplerSpec.timeout_s
    adapter_dir: str | None = SamplerSpec.adapter_dir
    litellm_config: str | None = None

    def validate(self) -> None:
        """Raise ConfigError naming the first value out of range."""
        try:
            self.sampler_spec().validate()
        except SamplerSpecError as error:
            raise ConfigError(f"{error.key}: {error}") from None
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
            "max_batch_tokens",
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
        if self.tis_cap is not None and not self.tis_cap >= 1:
            raise ConfigError(f"tis_cap must be >= 1 (or null to turn the correction off), got {self.tis_cap}")
        if not 0 < self.clip_low_threshold <= 1 <= self.clip_high_threshold:
            raise ConfigError(
                "clip thresholds are ratios with clip_low_threshold <= 1 <= clip_high_threshold (e.g. 0.8 / 1.28)"
            )
        if self.runner not in ("local", "ray"):
            raise ConfigError(
                f'runner must be "local" (agents in this process) or "ray" (each attempt a Ray task), '
                f"got {self.runner!r}"
            )
        if self.ray_address is not None and self.runner != "ray":
            raise ConfigError('ray_address is the Ray cluster of runner = "ray"; set runner = "ray" or drop it')
        for name, allowed in (("loss_fn", LossName), ("aggregation", Aggregation)):
            if getattr(self, name) not in get_args(allowed):
                raise ConfigError(f"{name} must be one of {', '.join(get_args(allowed))}, got {getattr(self, name)!r}")
        if self.kl_coef < 0:
            raise ConfigError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.warm_start.steps < 0:
            raise ConfigError(f"warm_start.steps must be >= 0, got {self.warm_start.steps}")
        self._validate_follow()
        if self.litellm_config is not None:
            from agl_bridge.proxy.server import ProxyStartError, litellm_config

            try:
                litellm_config([], "check", Path(self.litellm_config))
            except ProxyStartError as error:
                raise ConfigError(f"litellm_config: {error}") from None

    def store_location(self, run_dir: Path) -> str | Path:
        """Where the run records: `store` (a SQLite file or a postgresql:// URL), by default run_dir/store.sqlite."""
        return self.store or run_dir / "store.sqlite"

    def _validate_follow(self) -> None:
        follow = self.follow
        if self.mode not in ("online", "follow"):
            raise ConfigError(f'mode must be "online" (the trainer runs the agent) or "follow", got {self.mode!r}')
        if self.mode != "follow":
            return
        if self.offline_data:
            raise ConfigError('offline_data trains on recorded data; it cannot be combined with mode = "follow"')
        if follow.store is not None and self.sampler == "hf":
            raise ConfigError(
                "follow.store attaches to an agl-bridge serve, whose weights the trainer must update: set "
                'sampler = "remote" and sampler_urls = [that server\'s URL] (the in-process hf sampler needs the '
                "trainer to serve: leave follow.store unset)"
            )
        if not 1 <= follow.min_group_size <= self.group_size:
            raise ConfigError(
                f"follow.min_group_size must be between 1 and group_size ({self.group_size}), got "
                f"{follow.min_group_size}"
            )
        for name in ("group_timeout_s", "rollout_idle_timeout_s", "wait_report_s"):
            value = getattr(follow, name)
            if value is not None and not value > 0:
                raise ConfigError(f"follow.{name} must be > 0 seconds, got {value!r}")
        if not 0 <= follow.port <= 65535:
            raise ConfigError(f"follow.port must be a port number (0 picks a free one), got {follow.port}")

    def sampler_spec(self) -> SamplerSpec:
        """The sampler this run samples with: its `sampler*` keys, adapters under run_dir unless
        `adapter_dir` says otherwise, room for `concurrency` sequences, and the run's seed."""
        keys = {name: setting.key for name, setting in SamplerSpec.settings().items() if setting.key}
        spec = SamplerSpec(
            **{name: getattr(self, key) for name, key in keys.items()},
            max_batch_size=max(64, self.concurrency),
            seed=self.seed,
        )
        spec.adapter_dir = spec.adapter_dir or str(Path(self.run_dir) / "adapters")
        return spec


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
    if _relative_file(merged.get("store")):
        merged["store"] = str(base / merged["store"])
    follow = merged.get("follow")
    if isinstance(follow, dict) and _relative_file(follow.get("store")):
        merged["follow"] = {**follow, "store": str(base / follow["store"])}
    return config_from_dict(merged, where=str(path))


def config_from_dict(raw: dict[str, Any], *, where: str = "config") -> GRPOConfig:
    """Build and validate a GRPOConfig from a mapping; unknown keys are refused by name."""
    for key, replacement in REMOVED_KEYS.items():
        if key in raw:
            raise ConfigError(f"{where}: {key} was removed; use {replacement}")
    known = {f.name for f in dataclasses.fields(GRPOConfig)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; known keys: {', '.join(sorted(known))}")
    values = dict(raw)
    _check_types(values, GRPOConfig, where)
    for name, table in (("warm_start", WarmStartConfig), ("follow", FollowConfig)):
        if name in values:
            values[name] = _table(values[name], name, table, where)
    config = GRPOConfig(**values)
    config.validate()
    return config


def _table(value: Any, name: str, table: type, where: str) -> Any:
    """A nested settings table (warm_start, follow) built from a mapping, its keys and types checked by name."""
    if isinstance(value, table):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: {name} must be a table of settings, got {value!r}")
    known = {f.name for f in dataclasses.fields(table)}
    bad = sorted(set(value) - known)
    if bad:
        raise ConfigError(f"{where}: unknown key '{name}.{bad[0]}'; known: {', '.join(sorted(known))}")
    _check_types(value, table, f"{where}: {name}")
    return table(**value)


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


def _relative_file(store: object) -> bool:
    """Whether a `store` setting is a relative file path (resolved against the config's folder; a URL is not)."""
    return isinstance(store, str) and bool(store) and not is_postgres_location(store) and not Path(store).is_absolute()
