"""What the converter makes of a stored attempt: trajectories, their segments, and the conversion report.

A `Trajectory` is one succeeded attempt ready to train on; each `TrajectorySegment` is one token
sequence (a datum) with its loss mask, sampler logprobs and policy versions; `SegmentCall` says
where each merged LLM call sits in it. `ConversionReport` counts what a conversion converted,
dropped (`DropReason`) and split (`SplitKind`). The schema on disk: docs/trajectories.md.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

from agl_bridge import semconv
from agl_bridge.types import CallClass, check_count, check_id, finite_real


class DropReason(str, enum.Enum):
    """Why an attempt produced no trajectory; the keys of `ConversionReport.dropped`."""

    FAILED = "failed"
    """The attempt (or its rollout) failed: never trained on."""
    TIMED_OUT = "timed_out"
    """The attempt (or its rollout) timed out: never trained on."""
    NOT_FINISHED = "not_finished"
    """The attempt is still running, or its rollout is not final yet (rewards may still arrive)."""
    MISSING_REWARD = "missing_reward"
    """No reward was recorded and the policy is `missing_reward="drop"`."""
    NO_TRAINABLE_CALLS = "no_trainable_calls"
    """No call of the attempt is a selected token-level call of a class that trains."""


class SplitKind(str, enum.Enum):
    """Why a segment starts a new token sequence instead of continuing an earlier one."""

    NOT_EXTENDING = "not_extending"
    """The prompt is not the previous prompt + response followed by more tokens."""
    PREFIX_BREAK = "prefix_break"
    """As NOT_EXTENDING, and the proxy recorded why (the chat template re-rendered an earlier turn)."""
    MODEL_CHANGED = "model_changed"
    """The tokens extend, but another model made the call; a segment holds one model's samples."""
    CHOICE_BRANCH = "choice_branch"
    """Choice k > 0 of an n > 1 request: its own branch (only the first choice continues in place)."""


@dataclass(slots=True, kw_only=True)
class SegmentCall:
    """Where one LLM call sits in a segment: its response is `input_ids[response_start:response_end]`.

    Its prompt is exactly `input_ids[:response_start]` (that is what merging guarantees), so the
    observation tokens between this call and the one before it in the segment are
    `input_ids[previous.response_end:response_start]`. `rewards` are the rewards attributed to
    this call, summed by name. `call_class` and `parent_sequence` are its place in the rollout
    graph (`agl_bridge.convert.graph`; None in files written before the graph existed).
    """

    sequence: int
    choice_index: int
    response_start: int
    response_end: int
    agent_name: str | None = None
    finish_reason: str | None = None
    span_id: str | None = None
    rewards: dict[str, float] = field(default_factory=dict)
    call_class: CallClass | None = None
    parent_sequence: int | None = None

    def __post_init__(self) -> None:
        # One cheap test for the common case: the converter builds tens of thousands per second.
        sequence, choice, start, end = self.sequence, self.choice_index, self.response_start, self.response_end
        if (
            not (type(sequence) is int and type(choice) is int and type(start) is int and type(end) is int)
            or min(sequence, choice, start) < 0
        ):
            check_count("sequence", self.sequence, optional=False)
            check_count("choice_index", self.choice_index, optional=False)
            check_count("response_start", self.response_start, optional=False)
            check_count("response_end", self.response_end, optional=False)
        if self.response_end < self.response_start:
            raise ValueError(
                f"response_end ({self.response_end}) is before response_start ({self.response_start}) "
                f"for the call at sequence {self.sequence}"
            )
        if self.call_class is not None and type(self.call_class) is not CallClass:
            self.call_class = CallClass(self.call_class)


@dataclass(slots=True, kw_only=True)
class ExcludedCall:
    """A token call of a converted attempt that trains in no segment: its class does not train
    (`ConvertOptions.train_classes`), or the model/agent filters leave it out (`call_class` then
    says what it was all the same). `reason` says why, for people."""

    sequence: int
    choice_index: int
    call_class: CallClass
    parent_sequence: int | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        self.call_class = CallClass(self.call_class)


@dataclass(slots=True, kw_only=True)
class TrajectorySegment:
    """One training sequence ("datum"): full token ids with per-token mask, logprobs and versions.

    All four lists have one entry per token. `loss_mask` is 1 on sampled tokens and 0 on prompt
    and observation tokens; `sampler_logprobs` is the sampler's logprob on sampled tokens and 0.0
    where the mask is 0 (never NaN: 0 x NaN is NaN, which would poison a masked sum);
    `policy_versions` is the version that sampled each token, -1 where the mask is 0 (or where the
    version is unknown). `calls` are the LLM calls merged into it, in order. `split_kind` and
    `split_reason` say why this segment did not continue an earlier one (None for the first).
    `call_class` is its first call's class (a segment follows one conversation of the graph).
    """

    input_ids: list[int]
    loss_mask: list[int]
    sampler_logprobs: list[float]
    policy_versions: list[int]
    model: str
    calls: list[SegmentCall]
    split_kind: SplitKind | None = None
    split_reason: str | None = None
    call_class: CallClass | None = None

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        for name in ("loss_mask", "sampler_logprobs", "policy_versions"):
            length = len(getattr(self, name))
            if length != n:
                raise ValueError(
                    f"segment {name} has {length} entries but input_ids has {n}; every list needs one entry per token"
                )
        if not self.calls:
            raise ValueError("a segment needs at least one call (the one whose tokens it holds)")
        if self.calls[-1].response_end > n:
            raise ValueError(
                f"the last call's response ends at token {self.calls[-1].response_end}, past the segment's {n} tokens"
            )
        if self.split_kind is not None:
            self.split_kind = SplitKind(self.split_kind)
        if self.call_class is None:
            self.call_class = self.calls[0].call_class
        elif type(self.call_class) is not CallClass:
            self.call_class = CallClass(self.call_class)

    @property
    def num_sampled(self) -> int:
        """Tokens the policy sampled (mask 1) in this segment."""
        return sum(call.response_end - call.response_start for call in self.calls)


@dataclass(slots=True, kw_only=True)
class Trajectory:
    """What one succeeded attempt trains on: its segments plus the rewards that score them.

    `rewards` sums every reward of the attempt by name; `reward` is the return, the weighted sum
    of `rewards` (see `ConvertOptions.reward_weights`). `unattached_rewards` are the part of
    `rewards` attributed to no call (emitted before the first trainable call, or recorded for the
    rollout outside any attempt). `missing_reward` is True when no reward was recorded and the
    policy `missing_reward="zero"` gave it a return of 0.0. GRPO groups trajectories by
    `group_id` (the rollouts of one task in one step). `excluded_calls` are the attempt's token
    calls that train in no segment, with their class and why; `graph_warnings` what building the
    rollout graph warned about (an unknown declared parent, two main conversations at once).
    """

    rollout_id: str
    attempt_id: str
    group_id: str | None = None
    task: Any = None
    reward: float
    rewards: dict[str, float] = field(default_factory=dict)
    unattached_rewards: dict[str, float] = field(default_factory=dict)
    missing_reward: bool = False
    segments: list[TrajectorySegment]
    excluded_calls: list[ExcludedCall] = field(default_factory=list)
    graph_warnings: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_id("rollout_id", self.rollout_id, optional=False)
        check_id("attempt_id", self.attempt_id, optional=False)
        check_id("group_id", self.group_id, optional=True)
        self.reward = finite_real("trajectory reward", self.reward)
        if not self.segments:
            raise ValueError(
                f"trajectory of rollout {self.rollout_id!r} attempt {self.attempt_id!r} has no segments; "
                "an attempt with nothing to train on is dropped, not converted"
            )

    @property
    def num_calls(self) -> int:
        """LLM calls merged into this trajectory's segments."""
        return sum(len(segment.calls) for segment in self.segments)

    def call_classes(self) -> dict[tuple[int, int], CallClass | None]:
        """Every token call's class by (sequence, choice_index): the trained ones and the excluded ones."""
        found: dict[tuple[int, int], CallClass | None] = {
            (call.sequence, call.choice_index): call.call_class for segment in self.segments for call in segment.calls
        }
        found.update({(call.sequence, call.choice_index): call.call_class for call in self.excluded_calls})
        return found


_WHY_DROPPED = {
    DropReason.NOT_FINISHED.value: "attempts still running or of rollouts not finished (finish them: POST "
    ".../finish or finish_rollout(); serve --rollout-idle-timeout ends those nobody finishes)",
    DropReason.MISSING_REWARD.value: "attempts without a reward (--missing-reward zero trains them with return 0)",
    DropReason.FAILED.value: "failed attempts (never trained)",
    DropReason.TIMED_OUT.value: "timed-out attempts (never trained)",
    DropReason.NO_TRAINABLE_CALLS.value: "attempts with no token-level call of the selected models and agents",
}


MAX_REPORT_WARNINGS = 10
"""Graph warnings a report keeps word for word (all are counted)."""


@dataclass(slots=True, kw_only=True)
class ConversionReport:
    """What a conversion did: attempts converted or dropped (by `DropReason`), segments, splits.

    `calls_not_trained` counts calls by reason: "text" (no token ids), "not_selected" (another
    model or agent than the options select), "class_not_trained" (a class outside the options'
    `train_classes`), "dropped_attempt" (in an attempt that produced no trajectory),
    "outside_attempt" (a rollout's calls made outside any of its attempts). `rewards_ignored`
    counts rewards naming an attempt the store has no row for.

    The provenance audit, over converted attempts: `calls_by_class` (every token call's class),
    `trained_tokens_by_class` (loss-mask tokens by the class of the call that sampled them),
    `excluded_by_class` (token calls that train in no segment, by class), and `trained_tokens`
    against `trained_sampled_tokens` (of those, the ones that are a trained call's sampled ids:
    `sampled_share` must be 1.0). `graph_warnings` counts the rollout graphs' warnings; the first
    few are kept in `warnings`.
    """

    rollouts_seen: int = 0
    attempts_seen: int = 0
    attempts_converted: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    segments: int = 0
    splits: dict[str, int] = field(default_factory=dict)
    calls_seen: int = 0
    calls_trained: int = 0
    calls_not_trained: dict[str, int] = field(default_factory=dict)
    rewards_seen: int = 0
    rewards_ignored: int = 0
    missing_reward_zeroed: int = 0
    calls_by_class: dict[str, int] = field(default_factory=dict)
    trained_tokens_by_class: dict[str, int] = field(default_factory=dict)
    excluded_by_class: dict[str, int] = field(default_factory=dict)
    trained_tokens: int = 0
    trained_sampled_tokens: int = 0
    graph_warnings: int = 0
    warnings: list[str] = field(default_factory=list)

    @property
    def sampled_share(self) -> float:
        """Share of trained (loss-mask) tokens that are a trained call's sampled ids: 1.0 unless something broke."""
        return 1.0 if not self.trained_tokens else self.trained_sampled_tokens / self.trained_tokens

    @property
    def attempts_dropped(self) -> int:
        """Attempts that produced no trajectory, whatever the reason."""
        return sum(self.dropped.values())

    def left_out(self) -> str:
        """One line for people: what was not converted and why, and what was merged or split ("" if nothing)."""
        parts = [f"{n} {_WHY_DROPPED.get(reason, reason)}" for reason, n in sorted(self.dropped.items()) if n]
        outside = self.calls_not_trained.get("outside_attempt", 0)
        if outside:
            parts.append(f"{outside} calls made outside any attempt")
        if self.rewards_ignored:
            parts.append(f"{self.rewards_ignored} rewards naming an attempt the store has no row for")
        line = f"not converted: {'; '.join(parts)}" if parts else ""
        if self.splits:
            splits = ", ".join(f"{kind} {n}" for kind, n in sorted(self.splits.items()))
            turns = f"{self.calls_trained} calls merged into {self.segments} segments (splits: {splits})"
            line = f"{line}; {turns}" if line else turns
        return line

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict of every count."""
        return {
            "rollouts_seen": self.rollouts_seen,
            "attempts_seen": self.attempts_seen,
            "attempts_converted": self.attempts_converted,
            "attempts_dropped": self.attempts_dropped,
            "dropped": dict(self.dropped),
            "segments": self.segments,
            "splits": dict(self.splits),
            "calls_seen": self.calls_seen,
            "calls_trained": self.calls_trained,
            "calls_not_trained": dict(self.calls_not_trained),
            "rewards_seen": self.rewards_seen,
            "rewards_ignored": self.rewards_ignored,
            "missing_reward_zeroed": self.missing_reward_zeroed,
            **self.audit(),
            "trained_tokens": self.trained_tokens,
            "trained_sampled_tokens": self.trained_sampled_tokens,
        }

    def audit(self) -> dict[str, Any]:
        """The provenance audit as a training step logs it: calls, trained tokens and exclusions by class."""
        return {
            "calls_by_class": dict(in_class_order(self.calls_by_class)),
            "trained_tokens_by_class": dict(in_class_order(self.trained_tokens_by_class)),
            "excluded_by_class": dict(in_class_order(self.excluded_by_class)),
            "sampled_share": self.sampled_share,
            "graph_warnings": self.graph_warnings,
        }

    def by_class_line(self) -> str:
        """One line for people: calls and trained tokens per class ("" before any call was classified)."""
        if not self.calls_by_class:
            return ""
        parts = [
            f"{name} {n} calls / {self.trained_tokens_by_class.get(name, 0)} trained tokens"
            for name, n in in_class_order(self.calls_by_class)
        ]
        line = f"calls by class: {', '.join(parts)}; {self.sampled_share:.0%} of trained tokens are sampled tokens"
        if self.graph_warnings:
            line += f"; {self.graph_warnings} rollout-graph warnings, e.g. {self.warnings[0]}"
        return line


def in_class_order(counts: dict[str, int]) -> list[tuple[str, int]]:
    """`counts` in `CALL_CLASSES` order (reports list classes the same way everywhere)."""
    return [(name, counts[name]) for name in (*semconv.CALL_CLASSES, "unclassified") if name in counts]


def merged_reports(reports: Iterable[ConversionReport]) -> ConversionReport:
    """One report adding up several conversions' (the follow trainer converts a group at a time):
    every count summed, counts by key summed per key, the first few warnings kept."""
    total = ConversionReport()
    for report in reports:
        for item in fields(ConversionReport):
            mine, theirs = getattr(total, item.name), getattr(report, item.name)
            if isinstance(theirs, dict):
                for key, n in theirs.items():
                    mine[key] = mine.get(key, 0) + n
            elif isinstance(theirs, list):
                mine.extend(theirs[: max(0, MAX_REPORT_WARNINGS - len(mine))])
            else:
                setattr(total, item.name, mine + theirs)
    return total
