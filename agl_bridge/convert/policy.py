"""`ConvertOptions`: which calls train, how named rewards weigh into the return, what a missing reward does.

Kept apart from the conversion itself so the trainer, the CLI and tests build options the same way
and every choice is validated once, with an error naming the option.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from agl_bridge import semconv
from agl_bridge.types import CallClass, LLMCall

MissingRewardPolicy = Literal["drop", "zero", "error"]
"""What an attempt with no reward at all becomes: dropped (counted), a return of 0.0, or an error."""

_MISSING_REWARD_POLICIES = ("drop", "zero", "error")

SKIP_TEXT = "text"
"""A call with no token ids (kind "text"): never trained on."""

SKIP_NOT_SELECTED = "not_selected"
"""A token call of a model or agent the options do not select."""

SKIP_CLASS = "class_not_trained"
"""A token call whose class (`agl_bridge.convert.graph`) is not in `ConvertOptions.train_classes`."""

DEFAULT_TRAIN_CLASSES = frozenset({CallClass.MAIN, CallClass.SUBAGENT})
"""The call classes that train unless told otherwise: the conversation that earned the reward and
its sub-agents; retries and side calls never earned it, compactions only when asked."""

ALL_CALL_CLASSES = frozenset(CallClass)
"""Every call class: train every token call whatever it was (the converter before the rollout graph)."""


def parse_call_classes(option: str, names: Iterable[str | CallClass]) -> frozenset[CallClass]:
    """Call classes from names (ValueError naming `option` and the known classes for a wrong one)."""
    if isinstance(names, str):
        names = [part.strip() for part in names.split(",") if part.strip()]
    chosen = set()
    for name in names:
        try:
            chosen.add(CallClass(name))
        except ValueError:
            raise ValueError(
                f"{option} has {name!r}, which is not a call class; use some of {', '.join(semconv.CALL_CLASSES)}"
            ) from None
    return frozenset(chosen)


def _name_set(option: str, names: Iterable[str | None] | None) -> frozenset[str | None] | None:
    if names is None:
        return None
    if isinstance(names, str):
        raise ValueError(f"{option} must be a collection of names, e.g. [{names!r}], not the string {names!r}")
    chosen = frozenset(names)
    if not chosen:
        raise ValueError(f"{option} is empty, which would select no call at all; pass None to select every call")
    return chosen


@dataclass(frozen=True, slots=True, kw_only=True)
class ConvertOptions:
    """How `convert_attempt` / `convert_store` turn calls and rewards into trajectories.

    models: train only calls of these model names (None: every model).
    agent_names: train only calls of these agents (`LLMCall.agent_name`; include None for calls
      that name no agent). None: every agent. Both filters apply together; calls of kind "text"
      never train whatever the filters say.
    reward_weights: weight of each reward name in the return (names not listed weigh
      `default_reward_weight`). The return is sum(weight[name] * total[name]) over the names.
    missing_reward: "drop" (default; counted in the report), "zero" (return 0.0, marked
      `missing_reward`), or "error" (raise MissingRewardError naming the rollout and attempt).
    train_classes: the call classes that train (`agl_bridge.convert.graph`; names or `CallClass`
      values, or one comma-separated string). Default: main and subagent. Empty: an error.
    """

    models: frozenset[str] | None = None
    agent_names: frozenset[str | None] | None = None
    reward_weights: Mapping[str, float] = field(default_factory=dict)
    default_reward_weight: float = 1.0
    missing_reward: MissingRewardPolicy = "drop"
    train_classes: frozenset[CallClass] = DEFAULT_TRAIN_CLASSES

    def __post_init__(self) -> None:
        object.__setattr__(self, "models", _name_set("models", self.models))
        object.__setattr__(self, "agent_names", _name_set("agent_names", self.agent_names))
        weights: dict[str, float] = {}
        for name, weight in dict(self.reward_weights).items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"reward_weights keys must be reward names (non-empty strings), got {name!r}")
            weights[name] = _finite(f"reward_weights[{name!r}]", weight)
        object.__setattr__(self, "reward_weights", weights)
        object.__setattr__(self, "default_reward_weight", _finite("default_reward_weight", self.default_reward_weight))
        if self.missing_reward not in _MISSING_REWARD_POLICIES:
            raise ValueError(f"missing_reward must be one of {_MISSING_REWARD_POLICIES}, got {self.missing_reward!r}")
        classes = parse_call_classes("train_classes", self.train_classes)
        if not classes:
            known = ", ".join(semconv.CALL_CLASSES)
            raise ValueError(f"train_classes is empty, which would train no call at all; name some of {known}")
        object.__setattr__(self, "train_classes", classes)

    def weight(self, name: str) -> float:
        """The weight of reward `name` in the return."""
        return self.reward_weights.get(name, self.default_reward_weight)


def _finite(option: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{option} must be a finite number, got {value!r}")
    return float(value)


DEFAULT_OPTIONS = ConvertOptions()
"""Every token call of the main conversation and its sub-agents trains, every reward weighs 1.0,
attempts without a reward are dropped."""


def skip_reason(call: LLMCall, options: ConvertOptions) -> str | None:
    """Why `call` does not train under `options` (SKIP_TEXT, SKIP_NOT_SELECTED), or None if it does."""
    if call.kind != semconv.CALL_KIND_TOKEN:
        return SKIP_TEXT
    if options.models is not None and call.model not in options.models:
        return SKIP_NOT_SELECTED
    if options.agent_names is not None and call.agent_name not in options.agent_names:
        return SKIP_NOT_SELECTED
    return None


def weighted_return(totals: Mapping[str, float], options: ConvertOptions) -> float:
    """The return of reward totals by name: sum of weight(name) * total."""
    return math.fsum(options.weight(name) * value for name, value in totals.items())
