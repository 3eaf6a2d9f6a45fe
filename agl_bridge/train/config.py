"""The GRPO run's configuration: one dataclass, loaded from TOML, YAML or JSON with strict keys.

Unknown keys are refused by name (a typo must not silently fall back to a default), values are
checked for range, and every field has a default a user of this field would expect.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args
from urllib.parse import urlsplit

import yaml

from agl_bridge import semconv
from agl_bridge.convert.policy import DEFAULT_TRAIN_CLASSES, ConvertOptions
from agl_bridge.errors import ConfigError
from agl_bridge.primitives.advantages import AdvantageEstimator
from agl_bridge.primitives.client import DEFAULT_MAX_BATCH_TOKENS
from agl_bridge.primitives.correction import CorrectionLevel
from agl_bridge.primitives.losses import LOSSES
from agl_bridge.runner.proxies import ProxyAddress
from agl_bridge.sampler.factory import SamplerSpec, SamplerSpecError
from agl_bridge.store.location import is_postgres_location
from agl_bridge.train.schedule import LRSchedule, scheduled_learning_rate

Mode = Literal["online", "follow", "dpo"]
LossName = Literal["importance_sampling", "ppo", "cispo", "gspo"]
Aggregation = Literal["token_sum", "token_mean", "sequence_mean"]

CLIP_HIGHER = (0.8, 1.28)
"""The clip ratios of ppo / cispo in a run (clip-higher) unless the config sets them; gspo takes the loss's own."""


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
class OverlongPenaltyConfig:
    """DAPO's soft overlong penalty, added as the named reward "overlong" (in [-1, 0]).

    L = the tokens the policy sampled in the trajectory: 0 while L <= max_tokens − buffer, then
    falling linearly to −1 at L = max_tokens, −1 beyond. Its weight in the return:
    `reward_weights.overlong` (default 1).
    """

    max_tokens: int = 0
    buffer: int = 0


@dataclass
class RepetitionPenaltyConfig:
    """An n-gram redundancy penalty (the JustRL recipe's), added as the named reward "repetition" (in [-1, 0]).

    redundancy = 1 − distinct / total over the `ngram`-grams of each sampled response's token ids;
    the penalty is −(redundancy − threshold) / (1 − threshold) above `threshold`, else 0. Its weight
    in the return: `reward_weights.repetition` (default 1; JustRL uses 0.3).
    """

    ngram: int = 4
    threshold: float = 0.3


@dataclass
class JudgeConfig:
    """An LLM judge (RULER-style) that scores each group's rollouts relative to each other in one call.

    model: a model of the run's `litellm_config`, or the served policy model itself; rubric: what a
    good rollout does. Its scores (0..1) become the named reward "judge". A malformed answer is
    retried `max_retries` times, then the group is dropped and counted (never a silent 0).
    max_chars: the most characters of each rollout's transcript shown to the judge (its end kept).
    """

    model: str = ""
    rubric: str = ""
    max_retries: int = 2
    max_chars: int = 6000


@dataclass
class DPOConfig:
    """The preference data and strength of `mode = "dpo"`.

    data: JSONL of {"prompt": str or messages, "chosen": str, "rejected": str} per line, or a store
    (.sqlite) whose groups give (best, worst) rollout pairs; beta: DPO's β (the implicit reward's scale).
    """

    data: str | None = None
    beta: float = 0.1


TABLES: dict[str, type] = {
    "warm_start": WarmStartConfig,
    "follow": FollowConfig,
    "overlong_penalty": OverlongPenaltyConfig,
    "repetition_penalty": RepetitionPenaltyConfig,
    "judge": JudgeConfig,
    "dpo": DPOConfig,
}
"""The keys whose value is a table of settings, and the dataclass each becomes."""


@dataclass
class GRPOConfig:
    """Everything a GRPO run needs; see docs/training.md for each field's meaning."""

    mode: Mode = "online"
    agent: str | list[str] = ""
    tasks: str = ""
    eval_tasks: str | None = None
    validation_tasks: str | None = None
    keep_best: bool = False
    offline_data: str | None = None
    model: str = "tiny"
    run_dir: str = "runs/grpo"
    store: str | None = None
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
    lora_target_modules: str | list[str] = "all-linear"
    train_unembedding: bool = False
    loss_fn: LossName = "importance_sampling"
    tis_cap: float | None = 2.0
    rollout_correction: CorrectionLevel | None = None
    mis_low: float | None = None
    mis_high: float | None = None
    geo_low: float | None = None
    geo_high: float | None = None
    clip_low_threshold: float | None = None
    clip_high_threshold: float | None = None
    kl_coef: float = 0.0
    aggregation: Aggregation = "token_sum"
    advantage: AdvantageEstimator = "group_mean"
    advantage_std_scaling: bool = False
    overlong_penalty: OverlongPenaltyConfig | None = None
    repetition_penalty: RepetitionPenaltyConfig | None = None
    judge: JudgeConfig | None = None
    teacher: str | None = None
    dpo: DPOConfig = field(default_factory=DPOConfig)
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
    max_staleness: int = 0
    concurrency: int = 16
    runner: Literal["local", "ray"] = "local"
    ray_address: str | None = None
    proxy_urls: list[str] = field(default_factory=list)
    proxy_api_key: str | None = None
    rollout_timeout_s: float = 300.0
    max_attempts: int = 1
    default_max_tokens: int = 256
    eval_every: int = 5
    eval_group_size: int = 1
    final_eval_group_size: int | None = None
    checkpoint_every: int = 5
    missing_reward: Literal["drop", "zero", "error"] = "drop"
    reward_weights: dict[str, float] = field(default_factory=dict)
    train_call_classes: list[str] = field(default_factory=lambda: sorted(c.value for c in DEFAULT_TRAIN_CLASSES))
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
    sampler_dtype: str | None = SamplerSpec.dtype
    sampler_max_model_len: int | None = SamplerSpec.max_model_len
    sampler_max_lora_rank: int | None = SamplerSpec.max_lora_rank
    sampler_max_loras: int | None = SamplerSpec.max_loras
    sampler_enforce_eager: bool = SamplerSpec.enforce_eager
    sampler_process: bool | None = SamplerSpec.process
    adapter_dir: str | None = SamplerSpec.adapter_dir
    litellm_config: str | None = None

    def validate(self) -> None:
        """Raise ConfigError naming the first value out of range."""
        try:
            self.sampler_spec().validate()
        except SamplerSpecError as error:
            raise ConfigError(f"{error.key}: {error}") from None
        try:
            self.convert_options()
        except ValueError as error:
            raise ConfigError(str(error).replace("train_classes", "train_call_classes")) from None
        rank = self.lora_rank
        if self.sampler_max_lora_rank is not None and isinstance(rank, int) and self.sampler_max_lora_rank < rank:
            raise ConfigError(
                f"sampler_max_lora_rank ({self.sampler_max_lora_rank}) must be at least lora_rank ({self.lora_rank})"
            )
        if self.sampler != "hf" and self.train_unembedding:
            raise ConfigError(
                f"train_unembedding cannot be used with sampler {self.sampler!r}: vLLM loads LoRA weights only, not a "
                'fully trained lm_head; set train_unembedding = false or sampler = "hf"'
            )
        positive: tuple[str, ...] = (
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
        if self.final_eval_group_size is not None:
            positive += ("final_eval_group_size",)
        for name in positive:
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.keep_best and (self.mode != "online" or self.offline_data):
            raise ConfigError(
                "keep_best chooses among the adapters of an online run by their validation reward; this run is "
                f"{'offline' if self.offline_data else repr(self.mode)}: set keep_best = false"
            )
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
        low, high = self.clip_thresholds()
        if not 0 < low <= 1 <= high:
            raise ConfigError(
                "clip thresholds are ratios with clip_low_threshold <= 1 <= clip_high_threshold (e.g. 0.8 / 1.28)"
            )
        choices = (
            ("mode", Mode),
            ("loss_fn", LossName),
            ("aggregation", Aggregation),
            ("advantage", AdvantageEstimator),
            ("rollout_correction", CorrectionLevel),
        )
        for name, allowed in choices:
            value = getattr(self, name)
            if not (value is None and name == "rollout_correction") and value not in get_args(allowed):
                raise ConfigError(f"{name} must be one of {', '.join(get_args(allowed))}, got {value!r}")
        if self.runner not in ("local", "ray"):
            raise ConfigError(
                f'runner must be "local" (agents in this process) or "ray" (each attempt a Ray task), '
                f"got {self.runner!r}"
            )
        if self.ray_address is not None and self.runner != "ray":
            raise ConfigError('ray_address is the Ray cluster of runner = "ray"; set runner = "ray" or drop it')
        if self.kl_coef < 0:
            raise ConfigError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.warm_start.steps < 0:
            raise ConfigError(f"warm_start.steps must be >= 0, got {self.warm_start.steps}")
        if isinstance(self.lora_target_modules, list) and not all(
            isinstance(name, str) and name for name in self.lora_target_modules
        ):
            raise ConfigError(
                f'lora_target_modules must be "all-linear" or a list of module names, got {self.lora_target_modules!r}'
            )
        self._validate_correction()
        self._validate_rewards()
        self._validate_mode()
        self._validate_follow()
        self._validate_proxies()
        if self.litellm_config is not None:
            from agl_bridge.proxy.server import ProxyStartError, litellm_config

            try:
                litellm_config([], "check", Path(self.litellm_config))
            except ProxyStartError as error:
                raise ConfigError(f"litellm_config: {error}") from None
        if self.judge is not None:
            self._validate_judge(self.judge)

    def clip_thresholds(self) -> tuple[float, float]:
        """The clip ratios of the run's loss: the config's, else clip-higher for ppo / cispo and GSPO's own for gspo."""
        if self.loss_fn == "gspo":
            defaults = LOSSES["gspo"].config_defaults
            low, high = defaults["clip_low_threshold"], defaults["clip_high_threshold"]
        else:
            low, high = CLIP_HIGHER
        return (
            low if self.clip_low_threshold is None else self.clip_low_threshold,
            high if self.clip_high_threshold is None else self.clip_high_threshold,
        )

    def masking_keys(self) -> dict[str, float]:
        """The MIS and geometric-filter bounds the config sets, by key."""
        keys = ("mis_low", "mis_high", "geo_low", "geo_high")
        return {key: getattr(self, key) for key in keys if getattr(self, key) is not None}

    def _validate_correction(self) -> None:
        for side in ("mis", "geo"):
            low, high = getattr(self, f"{side}_low"), getattr(self, f"{side}_high")
            if low is not None and not 0 < low <= 1:
                raise ConfigError(f"{side}_low must be a ratio in (0, 1], e.g. 0.5, got {low}")
            if high is not None and high < 1:
                raise ConfigError(f"{side}_high must be a ratio >= 1, e.g. 2.0, got {high}")
        masking = self.masking_keys()
        if self.loss_fn == "gspo" and self.rollout_correction == "token":
            raise ConfigError(
                'loss_fn = "gspo" cannot be combined with rollout_correction = "token": GSPO\'s ratio is one per '
                'sequence and token weights would undo that; use rollout_correction = "sequence"'
            )
        if self.loss_fn != "importance_sampling" and self.rollout_correction is None and masking:
            raise ConfigError(
                f"{next(iter(masking))} needs rollout_correction with loss_fn = {self.loss_fn!r}: without it the "
                "clipped loss takes its ratio against the sampler itself and there is nothing to mask; set "
                'rollout_correction = "token" or "sequence"'
            )
        if self.rollout_correction is not None and self.tis_cap is None and not masking:
            raise ConfigError(
                f"rollout_correction = {self.rollout_correction!r} with tis_cap = null and no mis_/geo_ bounds leaves "
                "the importance weights unbounded; set tis_cap (e.g. 2.0) or mis_high"
            )

    def _validate_rewards(self) -> None:
        if self.advantage_std_scaling and self.advantage not in ("group_mean", "mean_std"):
            raise ConfigError(
                f"advantage_std_scaling = true is the mean_std estimator and contradicts advantage = "
                f"{self.advantage!r}; drop advantage_std_scaling"
            )
        if self.advantage == "dr_grpo" and self.aggregation != "token_sum":
            raise ConfigError(
                f'advantage = "dr_grpo" normalises by a constant, not by lengths; aggregation = {self.aggregation!r} '
                'would divide by lengths again: leave aggregation at "token_sum"'
            )
        if self.overlong_penalty is not None:
            penalty = self.overlong_penalty
            if not 1 <= penalty.buffer < penalty.max_tokens:
                raise ConfigError(
                    "overlong_penalty needs 1 <= buffer < max_tokens (tokens), got "
                    f"max_tokens = {penalty.max_tokens}, buffer = {penalty.buffer}"
                )
        if self.repetition_penalty is not None:
            repetition = self.repetition_penalty
            if repetition.ngram < 1 or not 0 <= repetition.threshold < 1:
                raise ConfigError(
                    "repetition_penalty needs ngram >= 1 and 0 <= threshold < 1, got "
                    f"ngram = {repetition.ngram}, threshold = {repetition.threshold}"
                )
        if self.teacher is not None:
            if not self.teacher:
                raise ConfigError("teacher must be a model directory or hub id, got an empty string")
            shaped = {
                "judge": self.judge is not None,
                "overlong_penalty": self.overlong_penalty is not None,
                "repetition_penalty": self.repetition_penalty is not None,
                "advantage": self.advantage != "group_mean",
                "advantage_std_scaling": self.advantage_std_scaling,
                "offline_data": self.offline_data is not None,
            }
            for key, set_ in shaped.items():
                if set_:
                    raise ConfigError(
                        f"teacher and {key} cannot be combined: with a teacher the advantage of every token is "
                        "teacher logprob − student logprob on freshly sampled tokens; rewards, their shaping and "
                        f"offline data play no part. Remove {key} or teacher"
                    )
        if self.judge is not None and self.offline_data is not None:
            raise ConfigError("judge and offline_data cannot be combined: the judge is called through the run's proxy")

    def _validate_mode(self) -> None:
        if self.mode != "dpo":
            return
        if not self.dpo.data:
            raise ConfigError('mode = "dpo" needs dpo.data: a JSONL of prompt/chosen/rejected pairs, or a store')
        if not self.dpo.beta > 0:
            raise ConfigError(f"dpo.beta must be > 0 (e.g. 0.1), got {self.dpo.beta}")
        for key in ("offline_data", "teacher", "judge", "overlong_penalty", "repetition_penalty"):
            if getattr(self, key) is not None:
                raise ConfigError(f'mode = "dpo" and {key} cannot be combined: DPO trains on dpo.data pairs only')

    def _validate_judge(self, judge: JudgeConfig) -> None:
        from agl_bridge.models.loading import served_model_name
        from agl_bridge.proxy.server import litellm_config

        if not judge.model or not judge.rubric:
            raise ConfigError('judge needs model and rubric, e.g. judge = {model = "judge", rubric = "..."}')
        if judge.max_retries < 0 or judge.max_chars < 100:
            raise ConfigError(
                f"judge.max_retries must be >= 0 and judge.max_chars >= 100, got {judge.max_retries}, {judge.max_chars}"
            )
        served = served_model_name(self.model)
        path = Path(self.litellm_config) if self.litellm_config else None
        known = [entry["model_name"] for entry in litellm_config([served], "check", path)["model_list"]]
        if judge.model not in known:
            raise ConfigError(
                f"judge.model {judge.model!r} is not served by the run's proxy; it serves {', '.join(known)} "
                "(add the judge to the LiteLLM config named by litellm_config)"
            )

    def store_location(self, run_dir: Path) -> str | Path:
        """Where the run records: `store` (a SQLite file or a postgresql:// URL), by default run_dir/store.sqlite."""
        return self.store or run_dir / "store.sqlite"

    def _validate_follow(self) -> None:
        follow = self.follow
        if self.mode != "follow":
            return
        for key in ("teacher", "judge", "overlong_penalty", "repetition_penalty"):
            if getattr(self, key) is not None:
                raise ConfigError(
                    f'mode = "follow" and {key} cannot be combined: the follow trainer trains on the rewards the '
                    "harness reports, not yet on rewards or advantages the trainer adds; "
                    f'remove {key} or use mode = "online"'
                )
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

    def _validate_proxies(self) -> None:
        if not self.proxy_urls:
            return
        if self.mode != "online" or self.offline_data:
            raise ConfigError(
                "proxy_urls spreads the online trainer's rollouts over extra proxies; "
                + (
                    'with mode = "follow" the harness picks the proxies: point it at them and leave proxy_urls out'
                    if self.mode == "follow"
                    else "this run runs no agent: leave proxy_urls out"
                )
            )
        if not (isinstance(self.store, str) and is_postgres_location(self.store)):
            raise ConfigError(
                'proxy_urls needs store = "postgresql://…": the extra proxies record into the run\'s store, so the '
                "run must use the PostgreSQL database they were started with (agl-bridge serve --store "
                "postgresql://…); a SQLite file is one process's"
            )
        if self.sampler != "remote":
            raise ConfigError(
                f'proxy_urls needs sampler = "remote" (got {self.sampler!r}): the extra proxies sample from the '
                "servers the trainer loads each new adapter into (agl-bridge serve --sampler remote --sampler-url "
                "with this run's sampler_urls); an in-process sampler's weights stay in this process"
            )
        if not isinstance(self.proxy_urls, list) or not all(isinstance(url, str) for url in self.proxy_urls):
            raise ConfigError(f"proxy_urls must be a list of URLs like http://10.0.0.5:4000, got {self.proxy_urls!r}")
        for url in self.proxy_urls:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc or parts.path.rstrip("/") not in ("", "/v1"):
                raise ConfigError(
                    f"proxy_urls: {url!r} is not a proxy's root URL like http://10.0.0.5:4000 (an agl-bridge serve)"
                )
        roots = [self._proxy_root(url) for url in self.proxy_urls]
        if len(set(roots)) != len(roots):
            raise ConfigError(f"proxy_urls must differ, got {self.proxy_urls}")
        if not (self.proxy_api_key or os.environ.get(semconv.ENV_PROXY_API_KEY)):
            raise ConfigError(
                "proxy_urls needs proxy_api_key: the key the extra proxies were started with (their --api-key), "
                f"or the {semconv.ENV_PROXY_API_KEY} environment variable"
            )

    @staticmethod
    def _proxy_root(url: str) -> str:
        text = url.strip().rstrip("/")
        return text[: -len("/v1")] if text.endswith("/v1") else text

    def extra_proxies(self) -> list[ProxyAddress]:
        """The extra proxies the online runner spreads its attempts over (`proxy_urls`), with their key."""
        key = self.proxy_api_key or os.environ.get(semconv.ENV_PROXY_API_KEY) or ""
        return [ProxyAddress(self._proxy_root(url), key) for url in self.proxy_urls]

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

    def convert_options(self) -> ConvertOptions:
        """How every mode converts what the store recorded: this run's reward weights, missing-reward
        policy and trained call classes (ValueError naming the option when one is wrong)."""
        return ConvertOptions(
            missing_reward=self.missing_reward,
            reward_weights=dict(self.reward_weights),
            train_classes=self.train_call_classes,  # type: ignore[arg-type]  # names, parsed there
        )

    def sampler_spec(self) -> SamplerSpec:
        """The sampler this run samples with: its `sampler*` keys, adapters under run_dir unless
        `adapter_dir` says otherwise, room for `concurrency` sequences, and the run's seed."""
        keys = {name: setting.key for name, setting in SamplerSpec.settings().items() if setting.key}
        spec = SamplerSpec(
            **{name: getattr(self, key) for name, key in keys.items()},
            max_batch_size=max(64, self.concurrency),
            seed=self.seed,
        )
        if spec.kind == "vllm" and spec.max_lora_rank is None and isinstance(self.lora_rank, int):
            spec.max_lora_rank = max(64, self.lora_rank)  # the engine must load the trainer's adapters
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
    for name in ("tasks", "eval_tasks", "validation_tasks", "adapter_dir", "litellm_config"):
        value = merged.get(name)
        if isinstance(value, str) and value and not Path(value).is_absolute():
            merged[name] = str(base / value)  # before validation, which may read the file
    for name in ("store", "offline_data"):  # a store, or offline data read from one: a file or a URL
        if _relative_file(merged.get(name)):
            merged[name] = str(base / merged[name])
    follow = merged.get("follow")
    if isinstance(follow, dict) and _relative_file(follow.get("store")):
        merged["follow"] = {**follow, "store": str(base / follow["store"])}
    dpo = merged.get("dpo")
    if (
        isinstance(dpo, dict)
        and isinstance(dpo.get("data"), str)
        and dpo["data"]
        and not Path(dpo["data"]).is_absolute()
    ):
        merged["dpo"] = {**dpo, "data": str(base / dpo["data"])}
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
    for name, schema in TABLES.items():
        if values.get(name) is not None:
            values[name] = _table(values[name], name, schema, where)
    config = GRPOConfig(**values)
    config.validate()
    return config


def _table(value: Any, name: str, table: type, where: str) -> Any:
    """A nested settings table (one of TABLES) built from a mapping, its keys and types checked by name."""
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
    "str | list[str]": (
        "a string or a list of strings",
        lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v)),
    ),
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
    """Whether a store setting (`store`, `offline_data`) is a relative file path (a URL is not)."""
    return isinstance(store, str) and bool(store) and not is_postgres_location(store) and not Path(store).is_absolute()
