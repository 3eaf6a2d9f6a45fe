"""The schema of a run's configuration: its sections — what every mode shares, then one section per
mode and per algorithm family, each with the checks of its own keys — and `GRPOConfig`, all of them.

A run config is still one flat file (`GRPOConfig` is all the sections together, plus the nested
tables `warm_start`, `follow`, `dpo`, `judge`, `overlong_penalty`, `repetition_penalty`). Each
section names the run kinds it belongs to (`RUNS`): a key of a section set in a run of another kind
is refused by name, with the kind (`GRPOConfig.validate`). A section's `_check_<name>` sees
the whole config, because a few rules join keys of two sections (a LoRA rank the sampler must hold).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args
from urllib.parse import urlsplit

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
RunKind = Literal["online", "offline", "follow", "dpo"]
"""What a run does: its `mode`, or "offline" for a GRPO run on `offline_data`."""

EVERY_RUN: tuple[RunKind, ...] = get_args(RunKind)
SAMPLING_RUNS: tuple[RunKind, ...] = ("online", "follow")
GRPO_RUNS: tuple[RunKind, ...] = ("online", "offline", "follow")

CLIP_HIGHER = (0.8, 1.28)
"""The clip ratios of ppo / cispo in a run (clip-higher) unless the config sets them; gspo takes the loss's own."""


def check_positive(config: Any, names: tuple[str, ...]) -> None:
    """ConfigError naming the first of `names` that is not an integer >= 1."""
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")


def check_choice(name: str, value: Any, allowed: Any) -> None:
    """ConfigError naming `name` unless `value` is one of the Literal `allowed`."""
    if value not in get_args(allowed):
        raise ConfigError(f"{name} must be one of {', '.join(get_args(allowed))}, got {value!r}")


# ---------------------------------------------------------------------------------------- tables


@dataclass
class WarmStartConfig:
    """A supervised warm start (cold-start SFT) before RL: `cross_entropy` on (prompt, response) pairs.

    `data`: JSONL with {"prompt": str or messages, "response": str} per line, the prompt also
    {"messages": [...], "tools": [...]} for an agent that sends tools (or use the Python API and pass
    pairs directly). The run evaluates before and after it.

    `merge_turns`: consecutive pairs of one conversation (each prompt starting with the previous pair's
    prompt and response, the multi-turn merge rule RL trajectories follow) are trained as one example, every
    response in it trained: a batch then carries whole episodes instead of single turns.
    """

    data: str | None = None
    steps: int = 0
    batch_size: int = 16
    learning_rate: float = 2e-3
    merge_turns: bool = False


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


# -------------------------------------------------------------------------------------- sections


@dataclass
class Section:
    """A section of a run config: its keys (the dataclass fields of a subclass), the kinds of run they
    belong to, and what to say of a key set in another kind of run."""

    RUNS: ClassVar[tuple[RunKind, ...]] = EVERY_RUN
    ELSEWHERE: ClassVar[dict[str, str]] = {}


@dataclass
class RunSection(Section):
    """What every run has: the model, where the run writes and records, its size, the conversion of
    what the store recorded (reward weights, missing rewards, trained call classes), logging."""

    RUNS: ClassVar[tuple[RunKind, ...]] = EVERY_RUN

    mode: Mode = "online"
    model: str = "tiny"
    run_dir: str = "runs/grpo"
    store: str | None = None
    steps: int = 10
    batch_size: int = 8
    group_size: int = 4
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
    default_max_tokens: int = 256
    checkpoint_every: int = 5
    missing_reward: Literal["drop", "zero", "error"] = "drop"
    reward_weights: dict[str, float] = field(default_factory=dict)
    train_call_classes: list[str] = field(default_factory=lambda: sorted(c.value for c in DEFAULT_TRAIN_CLASSES))
    seed: int = 0
    tensorboard: bool = True
    wandb_project: str | None = None
    litellm_config: str | None = None

    def _check_run(self, config: GRPOConfig) -> None:
        check_positive(self, ("steps", "batch_size", "group_size", "max_batch_tokens", "default_max_tokens"))
        check_positive(self, ("checkpoint_every",))
        try:
            self.convert_options()
        except ValueError as error:
            raise ConfigError(str(error).replace("train_classes", "train_call_classes")) from None
        if self.litellm_config is not None:
            from agl_bridge.proxy.server import ProxyStartError, litellm_config

            try:
                litellm_config([], "check", Path(self.litellm_config))
            except ProxyStartError as error:
                raise ConfigError(f"litellm_config: {error}") from None

    def convert_options(self) -> ConvertOptions:
        """How every mode converts what the store recorded: this run's reward weights, missing-reward
        policy and trained call classes (ValueError naming the option when one is wrong)."""
        return ConvertOptions(
            missing_reward=self.missing_reward,
            reward_weights=dict(self.reward_weights),
            train_classes=self.train_call_classes,  # type: ignore[arg-type]  # names, parsed there
        )

    def store_location(self, run_dir: Path) -> str | Path:
        """Where the run records: `store` (a SQLite file or a postgresql:// URL), by default run_dir/store.sqlite."""
        return self.store or run_dir / "store.sqlite"


@dataclass
class OptimizerSection(Section):
    """AdamW and the learning-rate schedule of every run's steps."""

    RUNS: ClassVar[tuple[RunKind, ...]] = EVERY_RUN

    learning_rate: float = 1e-4
    lr_schedule: LRSchedule = "constant"
    lr_warmup_steps: int = 0
    lr_final_ratio: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    weight_decay: float = 0.0
    grad_clip_norm: float = 1.0

    def _check_optimizer(self, config: GRPOConfig) -> None:
        if not self.learning_rate > 0:
            raise ConfigError(f"learning_rate must be > 0, got {self.learning_rate}")
        check_choice("lr_schedule", self.lr_schedule, LRSchedule)
        if not isinstance(self.lr_warmup_steps, int) or not 0 <= self.lr_warmup_steps < config.steps:
            raise ConfigError(f"lr_warmup_steps must be an integer in [0, steps), got {self.lr_warmup_steps!r}")
        if not 0 <= self.lr_final_ratio <= 1:
            raise ConfigError(f"lr_final_ratio must be in [0, 1], got {self.lr_final_ratio}")


@dataclass
class LoraSection(Section):
    """The LoRA every run trains (or, with `train_full_weights`, every weight of the model)."""

    RUNS: ClassVar[tuple[RunKind, ...]] = EVERY_RUN

    lora_rank: int = 16
    lora_alpha: float = 32.0
    lora_target_modules: str | list[str] = "all-linear"
    train_unembedding: bool = False
    train_full_weights: bool = False

    def _check_lora(self, config: GRPOConfig) -> None:
        check_positive(self, ("lora_rank",))
        if self.train_full_weights and self.train_unembedding:
            raise ConfigError("train_full_weights trains the output layer already; leave train_unembedding unset")
        if self.train_full_weights and config.sampler != "hf":
            raise ConfigError(
                f'train_full_weights publishes whole weights, which only sampler = "hf" loads live; sampler '
                f'"{config.sampler}" loads LoRA adapters — train a LoRA (leave train_full_weights unset) with it'
            )
        if isinstance(self.lora_target_modules, list) and not all(
            isinstance(name, str) and name for name in self.lora_target_modules
        ):
            raise ConfigError(
                f'lora_target_modules must be "all-linear" or a list of module names, got {self.lora_target_modules!r}'
            )


TrainerLaunch = Literal["processes", "ray"]
"""Where a run starts its trainer's worker ranks: processes on this machine, or Ray tasks."""

TrainerSharding = Literal["replicate", "fsdp"]
"""How the trainer's ranks hold the model: a whole replica each, or FSDP2 shards (docs/scaling.md)."""


@dataclass
class RanksSection(Section):
    """How many processes train: data-parallel ranks of the trainer (docs/scaling.md)."""

    RUNS: ClassVar[tuple[RunKind, ...]] = EVERY_RUN

    trainer_ranks: int = 1
    trainer_launch: TrainerLaunch = "processes"
    trainer_timeout_s: float = 600.0
    trainer_sharding: TrainerSharding = "replicate"

    def _check_ranks(self, config: GRPOConfig) -> None:
        check_positive(self, ("trainer_ranks",))
        check_choice("trainer_launch", self.trainer_launch, TrainerLaunch)
        check_choice("trainer_sharding", self.trainer_sharding, TrainerSharding)
        if self.trainer_sharding == "fsdp" and config.run_kind() == "dpo":
            raise ConfigError(
                'trainer_sharding = "fsdp" cannot train DPO: its loss couples each pair, so one rank computes '
                'it whole; use trainer_sharding = "replicate" (the default)'
            )
        timeout = self.trainer_timeout_s
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 < timeout < math.inf:
            raise ConfigError(f"trainer_timeout_s must be a number of seconds > 0, got {timeout!r}")


@dataclass
class PolicyLossSection(Section):
    """The policy-gradient loss of the GRPO runs: the loss, its clip ratios, the rollout correction
    against the sampler's logprobs, the KL penalty, how token losses add up."""

    RUNS: ClassVar[tuple[RunKind, ...]] = GRPO_RUNS

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

    def _check_policy_loss(self, config: GRPOConfig) -> None:
        check_choice("loss_fn", self.loss_fn, LossName)
        check_choice("aggregation", self.aggregation, Aggregation)
        if self.rollout_correction is not None:
            check_choice("rollout_correction", self.rollout_correction, CorrectionLevel)
        if self.tis_cap is not None and not self.tis_cap >= 1:
            raise ConfigError(f"tis_cap must be >= 1 (or null to turn the correction off), got {self.tis_cap}")
        low, high = self.clip_thresholds()
        if not 0 < low <= 1 <= high:
            raise ConfigError(
                "clip thresholds are ratios with clip_low_threshold <= 1 <= clip_high_threshold (e.g. 0.8 / 1.28)"
            )
        if self.kl_coef < 0:
            raise ConfigError(f"kl_coef must be >= 0, got {self.kl_coef}")
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


@dataclass
class AdvantageSection(Section):
    """How the GRPO runs turn a group's returns into advantages."""

    RUNS: ClassVar[tuple[RunKind, ...]] = GRPO_RUNS

    advantage: AdvantageEstimator = "group_mean"
    advantage_std_scaling: bool = False

    def _check_advantage(self, config: GRPOConfig) -> None:
        check_choice("advantage", self.advantage, AdvantageEstimator)
        if self.advantage_std_scaling and self.advantage not in ("group_mean", "mean_std"):
            raise ConfigError(
                f"advantage_std_scaling = true is the mean_std estimator and contradicts advantage = "
                f"{self.advantage!r}; drop advantage_std_scaling"
            )
        if self.advantage == "dr_grpo" and config.aggregation != "token_sum":
            raise ConfigError(
                f'advantage = "dr_grpo" normalises by a constant, not by lengths; aggregation = {config.aggregation!r} '
                'would divide by lengths again: leave aggregation at "token_sum"'
            )


@dataclass
class ShapingSection(Section):
    """Penalties the trainer adds to a trajectory's return from its tokens (online and offline GRPO)."""

    RUNS: ClassVar[tuple[RunKind, ...]] = ("online", "offline")

    overlong_penalty: OverlongPenaltyConfig | None = None
    repetition_penalty: RepetitionPenaltyConfig | None = None

    def _check_shaping(self, config: GRPOConfig) -> None:
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


@dataclass
class ModelSignalSection(Section):
    """Models that score the online run's rollouts through its proxy: a judge's group rewards, or a
    teacher whose logprobs are the per-token advantage (on-policy distillation)."""

    RUNS: ClassVar[tuple[RunKind, ...]] = ("online",)

    judge: JudgeConfig | None = None
    teacher: str | None = None

    def _check_model_signal(self, config: GRPOConfig) -> None:
        if self.teacher is not None:
            if not self.teacher:
                raise ConfigError("teacher must be a model directory or hub id, got an empty string")
            shaped = {
                "judge": self.judge is not None,
                "overlong_penalty": config.overlong_penalty is not None,
                "repetition_penalty": config.repetition_penalty is not None,
                "advantage": config.advantage != "group_mean",
                "advantage_std_scaling": config.advantage_std_scaling,
            }
            for key, set_ in shaped.items():
                if set_:
                    raise ConfigError(
                        f"teacher and {key} cannot be combined: with a teacher the advantage of every token is "
                        "teacher logprob − student logprob on freshly sampled tokens; rewards and their shaping "
                        f"play no part. Remove {key} or teacher"
                    )
        if self.judge is not None:
            self._refuse_bad_judge(config, self.judge)

    @staticmethod
    def _refuse_bad_judge(config: GRPOConfig, judge: JudgeConfig) -> None:
        from agl_bridge.models.loading import served_model_name
        from agl_bridge.proxy.server import litellm_config

        if not judge.model or not judge.rubric:
            raise ConfigError('judge needs model and rubric, e.g. judge = {model = "judge", rubric = "..."}')
        if judge.max_retries < 0 or judge.max_chars < 100:
            raise ConfigError(
                f"judge.max_retries must be >= 0 and judge.max_chars >= 100, got {judge.max_retries}, {judge.max_chars}"
            )
        served = served_model_name(config.model)
        path = Path(config.litellm_config) if config.litellm_config else None
        known = [entry["model_name"] for entry in litellm_config([served], "check", path)["model_list"]]
        if judge.model not in known:
            raise ConfigError(
                f"judge.model {judge.model!r} is not served by the run's proxy; it serves {', '.join(known)} "
                "(add the judge to the LiteLLM config named by litellm_config)"
            )


@dataclass
class SamplingSection(Section):
    """What the runs that sample have: how many sequences at once, how stale their data may be, and
    the supervised warm start before RL."""

    RUNS: ClassVar[tuple[RunKind, ...]] = SAMPLING_RUNS

    concurrency: int = 16
    max_staleness: int = 0
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)

    def _check_sampling(self, config: GRPOConfig) -> None:
        check_positive(self, ("concurrency",))
        if self.max_staleness < 0:
            raise ConfigError(f"max_staleness must be >= 0, got {self.max_staleness}")
        if self.warm_start.steps < 0:
            raise ConfigError(f"warm_start.steps must be >= 0, got {self.warm_start.steps}")


@dataclass
class OnlineSection(Section):
    """The online mode: the agent and its tasks, how the runner runs them, held-out evaluation."""

    RUNS: ClassVar[tuple[RunKind, ...]] = ("online",)
    ELSEWHERE: ClassVar[dict[str, str]] = {
        "proxy_urls": "a follow run's harness picks the proxies itself (point it at them)",
        "keep_best": "it chooses among the adapters of an online run by their validation reward",
    }

    agent: str | list[str] = ""
    tasks: str = ""
    shuffle_tasks: bool = True
    eval_tasks: str | None = None
    validation_tasks: str | None = None
    keep_best: bool = False
    runner: Literal["local", "ray"] = "local"
    ray_address: str | None = None
    proxy_urls: list[str] = field(default_factory=list)
    proxy_api_key: str | None = None
    rollout_timeout_s: float = 300.0
    max_attempts: int = 1
    eval_every: int = 5
    eval_group_size: int = 1
    final_eval_group_size: int | None = None

    def _check_online(self, config: GRPOConfig) -> None:
        check_positive(self, ("max_attempts", "eval_every", "eval_group_size"))
        if self.final_eval_group_size is not None:
            check_positive(self, ("final_eval_group_size",))
        if self.runner not in ("local", "ray"):
            raise ConfigError(
                f'runner must be "local" (agents in this process) or "ray" (each attempt a Ray task), '
                f"got {self.runner!r}"
            )
        if self.ray_address is not None and self.runner != "ray":
            raise ConfigError('ray_address is the Ray cluster of runner = "ray"; set runner = "ray" or drop it')
        self._refuse_bad_proxies(config)

    def _refuse_bad_proxies(self, config: GRPOConfig) -> None:
        if not self.proxy_urls:
            return
        if not (isinstance(config.store, str) and is_postgres_location(config.store)):
            raise ConfigError(
                'proxy_urls needs store = "postgresql://…": the extra proxies record into the run\'s store, so the '
                "run must use the PostgreSQL database they were started with (agl-bridge serve --store "
                "postgresql://…); a SQLite file is one process's"
            )
        if config.sampler != "remote":
            raise ConfigError(
                f'proxy_urls needs sampler = "remote" (got {config.sampler!r}): the extra proxies sample from the '
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
        roots = [_proxy_root(url) for url in self.proxy_urls]
        if len(set(roots)) != len(roots):
            raise ConfigError(f"proxy_urls must differ, got {self.proxy_urls}")
        if not (self.proxy_api_key or os.environ.get(semconv.ENV_PROXY_API_KEY)):
            raise ConfigError(
                "proxy_urls needs proxy_api_key: the key the extra proxies were started with (their --api-key), "
                f"or the {semconv.ENV_PROXY_API_KEY} environment variable"
            )

    def extra_proxies(self) -> list[ProxyAddress]:
        """The extra proxies the online runner spreads its attempts over (`proxy_urls`), with their key."""
        key = self.proxy_api_key or os.environ.get(semconv.ENV_PROXY_API_KEY) or ""
        return [ProxyAddress(_proxy_root(url), key) for url in self.proxy_urls]


@dataclass
class OfflineSection(Section):
    """Offline GRPO: trajectories recorded earlier (a store or an export) instead of an agent."""

    RUNS: ClassVar[tuple[RunKind, ...]] = ("offline",)

    offline_data: str | None = None

    def _check_offline(self, config: GRPOConfig) -> None:
        if self.offline_data and config.mode != "online":
            raise ConfigError(
                f"offline_data trains on recorded data; it cannot be combined with mode = {config.mode!r}: "
                "remove offline_data, or the mode"
            )


@dataclass
class FollowSection(Section):
    """The follow mode's table (`follow`): an outside harness sends the rollouts."""

    RUNS: ClassVar[tuple[RunKind, ...]] = ("follow",)

    follow: FollowConfig = field(default_factory=FollowConfig)

    def _check_follow(self, config: GRPOConfig) -> None:
        follow = self.follow
        if follow.store is not None and config.sampler == "hf":
            raise ConfigError(
                "follow.store attaches to an agl-bridge serve, whose weights the trainer must update: set "
                'sampler = "remote" and sampler_urls = [that server\'s URL] (the in-process hf sampler needs the '
                "trainer to serve: leave follow.store unset)"
            )
        if not 1 <= follow.min_group_size <= config.group_size:
            raise ConfigError(
                f"follow.min_group_size must be between 1 and group_size ({config.group_size}), got "
                f"{follow.min_group_size}"
            )
        for name in ("group_timeout_s", "rollout_idle_timeout_s", "wait_report_s"):
            value = getattr(follow, name)
            if value is not None and not value > 0:
                raise ConfigError(f"follow.{name} must be > 0 seconds, got {value!r}")
        if not 0 <= follow.port <= 65535:
            raise ConfigError(f"follow.port must be a port number (0 picks a free one), got {follow.port}")


@dataclass
class DPOSection(Section):
    """DPO's table (`dpo`): its preference data and β."""

    RUNS: ClassVar[tuple[RunKind, ...]] = ("dpo",)

    dpo: DPOConfig = field(default_factory=DPOConfig)

    def _check_dpo(self, config: GRPOConfig) -> None:
        if not self.dpo.data:
            raise ConfigError('mode = "dpo" needs dpo.data: a JSONL of prompt/chosen/rejected pairs, or a store')
        if not self.dpo.beta > 0:
            raise ConfigError(f"dpo.beta must be > 0 (e.g. 0.1), got {self.dpo.beta}")


@dataclass
class SamplerSection(Section):
    """The sampler of the runs that sample; `SamplerSpec` describes each key (defaults, checks, help)
    and `GRPOConfig.sampler_spec` maps them onto it."""

    RUNS: ClassVar[tuple[RunKind, ...]] = SAMPLING_RUNS

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

    def _check_sampler(self, config: GRPOConfig) -> None:
        try:
            config.sampler_spec().validate()
        except SamplerSpecError as error:
            raise ConfigError(f"{error.key}: {error}") from None
        rank = config.lora_rank
        if self.sampler_max_lora_rank is not None and isinstance(rank, int) and self.sampler_max_lora_rank < rank:
            raise ConfigError(
                f"sampler_max_lora_rank ({self.sampler_max_lora_rank}) must be at least lora_rank ({rank})"
            )
        if self.sampler != "hf" and config.train_unembedding:
            raise ConfigError(
                f"train_unembedding cannot be used with sampler {self.sampler!r}: vLLM loads LoRA weights only, not a "
                'fully trained lm_head; set train_unembedding = false or sampler = "hf"'
            )


SECTIONS: tuple[tuple[type[Section], Callable[[Any, Any], None]], ...] = (
    (RunSection, RunSection._check_run),
    (OptimizerSection, OptimizerSection._check_optimizer),
    (LoraSection, LoraSection._check_lora),
    (RanksSection, RanksSection._check_ranks),
    (PolicyLossSection, PolicyLossSection._check_policy_loss),
    (AdvantageSection, AdvantageSection._check_advantage),
    (ShapingSection, ShapingSection._check_shaping),
    (ModelSignalSection, ModelSignalSection._check_model_signal),
    (SamplingSection, SamplingSection._check_sampling),
    (OnlineSection, OnlineSection._check_online),
    (OfflineSection, OfflineSection._check_offline),
    (FollowSection, FollowSection._check_follow),
    (DPOSection, DPOSection._check_dpo),
    (SamplerSection, SamplerSection._check_sampler),
)
"""A run config's sections, each with the check of its keys, in the order they are checked."""

RUN_KINDS: dict[str, tuple[str, str]] = {
    "online": ("an online run", 'mode = "online": an agent run through the proxy'),
    "offline": ("an offline run", "offline_data is set: recorded trajectories"),
    "follow": ("a follow run", 'mode = "follow": an outside harness sends the rollouts'),
    "dpo": ("a DPO run", 'mode = "dpo": preference pairs'),
}
"""Each kind of run as an error message names it, and what makes a config that kind."""


@dataclass
class GRPOConfig(
    SamplerSection,
    DPOSection,
    FollowSection,
    OfflineSection,
    OnlineSection,
    SamplingSection,
    ModelSignalSection,
    ShapingSection,
    AdvantageSection,
    PolicyLossSection,
    RanksSection,
    LoraSection,
    OptimizerSection,
    RunSection,
):
    """Everything a training run needs: every section's keys (`SECTIONS`); see docs/training.md for each."""

    def run_kind(self) -> RunKind:
        """What this run does: its mode, or "offline" for an online-mode config with `offline_data`."""
        return "offline" if self.mode == "online" and self.offline_data else self.mode

    def validate(self) -> None:
        """Raise ConfigError naming the first key that is wrong: a key of another kind of run, or a
        value out of range (checked by the section that defines it)."""
        check_choice("mode", self.mode, Mode)
        self._check_offline(self)
        kind = self.run_kind()
        for section, check in SECTIONS:
            if kind in section.RUNS:
                check(self, self)
            else:
                self._refuse_keys_of(section, kind)

    def _refuse_keys_of(self, section: type[Section], kind: RunKind) -> None:
        """ConfigError naming the first key of `section` (a section of other kinds of run) set to a
        value other than its default."""
        for item in dataclasses.fields(section):
            default = item.default_factory() if item.default_factory is not dataclasses.MISSING else item.default
            if getattr(self, item.name) != default:
                *others, last = [RUN_KINDS[run][0] for run in section.RUNS]
                runs = f"{', '.join(others)} or {last}" if others else last
                this, because = RUN_KINDS[kind]
                why = section.ELSEWHERE.get(item.name)
                raise ConfigError(
                    f"{item.name} is a setting of {runs}; this run is {this} ({because})"
                    + (f"; {why}" if why else "")
                    + f": remove {item.name}"
                )

    def digest(self) -> str:
        """sha256 of every key's value: ranks launched apart (torchrun) compare it to train alike."""
        text = json.dumps(dataclasses.asdict(self), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

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


def _proxy_root(url: str) -> str:
    text = url.strip().rstrip("/")
    return text[: -len("/v1")] if text.endswith("/v1") else text
