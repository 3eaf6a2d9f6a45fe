"""What was trained: a rollout's attempts through the converter, with the trainer's GRPO advantages.

The converter runs here exactly as the trainer ran it (`convert_rollout_attempts` with the run's
`ConvertOptions`), over the stored token ids, so the token view shows the very sequences, masks,
sampler logprobs and policy versions the trainer got — or the `DropReason` it got instead. The
advantage is `group_advantages` (agl_bridge/train/advantages.py) over the trajectories of the
rollout's group with the run's estimator: return minus the group mean (÷ std, or × n/(n−1) for
RLOO), a zero-variance group dropped (nothing trained).

The token markup is built here in one pass rather than in a template: a segment can hold tens of
thousands of tokens, and a Python join is an order of magnitude faster than a template loop.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from markupsafe import Markup, escape

from agl_bridge import semconv
from agl_bridge.convert import ConversionReport, DropReason, Trajectory, TrajectorySegment, convert_rollout_attempts
from agl_bridge.convert.graph import label_calls
from agl_bridge.train.advantages import group_advantages
from agl_bridge.types import Attempt, Rollout, RolloutRecords
from agl_bridge.viewer.records import Reader, marks, rollout_records
from agl_bridge.viewer.run_dir import RunSettings
from agl_bridge.viewer.tokens import TokenTexts

CallLabel = tuple[str, int | None, str]
"""A call's class, parent call sequence (None for a root) and why."""

CALL_CLASSES = semconv.CALL_CLASSES
"""The classes a page's filter offers, in report order."""

CONTEXT_SHOWN = 256
"""Context tokens shown before a segment's first trained token unless the page asks for all."""

MAX_TOKENS_SHOWN = 20_000
"""Tokens shown per segment unless the page asks for all."""

DROP_EXPLANATIONS: dict[DropReason, str] = {
    DropReason.FAILED: "the attempt (or its rollout) failed; failed attempts are never trained on",
    DropReason.TIMED_OUT: "the attempt (or its rollout) timed out; timed-out attempts are never trained on",
    DropReason.NOT_FINISHED: "the attempt is still running, or its rollout is not final yet (rewards may still "
    "arrive); nothing of it trains until it is",
    DropReason.MISSING_REWARD: "no reward was recorded and the run drops attempts without one "
    '(missing_reward = "drop")',
    DropReason.NO_TRAINABLE_CALLS: "none of its calls has token ids the run trains on (text-only calls, or "
    "models/agents the run does not select)",
}
"""Why the converter gave an attempt no trajectory, in words."""


AttemptKey = tuple[str, str]
"""(rollout id, attempt id)."""


@dataclass(slots=True)
class GroupTraining:
    """A GRPO group as the trainer saw it: each attempt's trajectory or drop reason, and the advantages."""

    group_id: str
    records: dict[str, RolloutRecords] = field(default_factory=dict)
    outcomes: dict[AttemptKey, Trajectory | DropReason] = field(default_factory=dict)
    advantages: dict[AttemptKey, float] = field(default_factory=dict)
    zero_variance: bool = False
    std_scaling: bool = False
    estimator: str = "group_mean"

    @property
    def returns(self) -> list[float]:
        """The returns of the group's trajectories."""
        return [o.reward for o in self.outcomes.values() if isinstance(o, Trajectory)]

    @property
    def mean_return(self) -> float | None:
        """The group mean the advantages are taken from."""
        returns = self.returns
        return sum(returns) / len(returns) if returns else None

    def describe(self, key: AttemptKey) -> str:
        """The advantage of one attempt, or why it has none, in a few words."""
        outcome = self.outcomes.get(key)
        if outcome is None:
            return ""
        if isinstance(outcome, DropReason):
            return f"not trained ({outcome.value})"
        if key in self.advantages:
            return f"{self.advantages[key]:+.3f}"
        if len(self.returns) == 1:
            return "0 (alone in its group)"
        return "0 (equal returns in the group)"


def group_key(rollout: Rollout) -> str:
    """The key of the GRPO group a rollout trains in: its group id, else its own id (a group of one)."""
    return rollout.group_id if rollout.group_id is not None else rollout.rollout_id


def train_groups(conn: Reader, rollouts: Iterable[Rollout], settings: RunSettings) -> dict[str, GroupTraining]:
    """The GroupTraining of each rollout's group, by `group_key`."""
    members: dict[str, list[str]] = {}
    group_ids = []
    for rollout in rollouts:
        if rollout.group_id is None:
            members[rollout.rollout_id] = [rollout.rollout_id]
        else:
            group_ids.append(rollout.group_id)
    members.update(group_members(conn, group_ids))
    return _train_members(conn, members, settings)


def group_members(conn: Reader, group_ids: Iterable[str]) -> dict[str, list[str]]:
    """The rollout ids of each group, in creation order."""
    wanted = list(dict.fromkeys(group_ids))
    members: dict[str, list[str]] = {group_id: [] for group_id in wanted}
    if wanted:
        for rollout_id, group_id in conn.execute(
            f"SELECT rollout_id, group_id FROM rollouts WHERE group_id IN ({marks(wanted)}) ORDER BY rowid", wanted
        ):
            members[group_id].append(rollout_id)
    return members


def train_group_ids(conn: Reader, group_ids: Iterable[str], settings: RunSettings) -> dict[str, GroupTraining]:
    """The GroupTraining of each group id."""
    return _train_members(conn, group_members(conn, group_ids), settings)


def _train_members(conn: Reader, members: dict[str, list[str]], settings: RunSettings) -> dict[str, GroupTraining]:
    records = {r.rollout.rollout_id: r for r in rollout_records(conn, [i for ids in members.values() for i in ids])}
    return {key: _train_group(key, [records[i] for i in ids if i in records], settings) for key, ids in members.items()}


def _train_group(group_id: str, records: list[RolloutRecords], settings: RunSettings) -> GroupTraining:
    group = GroupTraining(group_id, std_scaling=settings.std_scaling, estimator=settings.advantage)
    report = ConversionReport()
    for rollout in records:
        group.records[rollout.rollout.rollout_id] = rollout
        for bundle, outcome in convert_rollout_attempts(rollout, settings.options, report):
            group.outcomes[(rollout.rollout.rollout_id, bundle.attempt.attempt_id)] = outcome
    trajectories = [o for o in group.outcomes.values() if isinstance(o, Trajectory)]
    if trajectories:
        estimator = "mean_std" if settings.std_scaling else settings.advantage
        batch = group_advantages(trajectories, estimator=estimator)
        group.advantages = {
            (t.rollout_id, t.attempt_id): advantage for t, advantage in batch.items if isinstance(advantage, float)
        }  # a group's advantages are one number per trajectory (per-token ones come only from a teacher)
        group.zero_variance = batch.groups_dropped_zero_variance > 0
    return group


@dataclass(slots=True)
class SegmentView:
    """One trained sequence of an attempt, ready to show."""

    index: int
    segment: TrajectorySegment
    tokens: Markup
    shown_from: int
    shown_to: int

    @property
    def trained(self) -> int:
        """Tokens with loss mask 1."""
        return self.segment.num_sampled


@dataclass(slots=True)
class AttemptTraining:
    """One attempt's trained view: its trajectory (or drop reason), advantage, segments and untrained calls."""

    attempt: Attempt
    group: GroupTraining
    outcome: Trajectory | DropReason | None
    segments: list[SegmentView] = field(default_factory=list)
    untrained_calls: list[tuple[int, int, str, str | None]] = field(default_factory=list)
    """(sequence, choice, why, class or None for a text call) of each call that trains in no segment."""
    token_text: str = "ready"

    @property
    def trajectory(self) -> Trajectory | None:
        """The trajectory, if the attempt trained."""
        return self.outcome if isinstance(self.outcome, Trajectory) else None

    @property
    def drop_explanation(self) -> str | None:
        """Why the attempt did not train, if it did not."""
        return DROP_EXPLANATIONS[self.outcome] if isinstance(self.outcome, DropReason) else None

    @property
    def key(self) -> AttemptKey:
        """(rollout id, attempt id)."""
        return (self.attempt.rollout_id, self.attempt.attempt_id)

    @property
    def advantage(self) -> float | None:
        """The advantage the trainer gave every trained token (None: not trained; 0.0: zero-variance group)."""
        if self.trajectory is None:
            return None
        return self.group.advantages.get(self.key, 0.0)


def attempt_training(
    group: GroupTraining, attempt: Attempt, texts: TokenTexts, *, full: bool = False
) -> AttemptTraining:
    """The trained view of one attempt of a rollout of `group`."""
    key = (attempt.rollout_id, attempt.attempt_id)
    view = AttemptTraining(attempt, group, group.outcomes.get(key))
    trajectory = view.trajectory
    if trajectory is not None:
        view.segments = [_segment_view(i, s, texts, full) for i, s in enumerate(trajectory.segments)]
        records = group.records[attempt.rollout_id]
        bundle = next(b for b in records.attempts if b.attempt.attempt_id == attempt.attempt_id)
        for call in bundle.calls:
            if call.kind != semconv.CALL_KIND_TOKEN:
                view.untrained_calls.append((call.sequence or 0, call.choice_index, "text only", None))
        for excluded in trajectory.excluded_calls:
            untrained = (excluded.sequence, excluded.choice_index, excluded.reason, excluded.call_class.value)
            view.untrained_calls.append(untrained)
        view.untrained_calls.sort()
    view.token_text = texts.status
    return view


def call_labels(group: GroupTraining, rollout_id: str, attempt_id: str | None) -> dict[tuple[int, int], CallLabel]:
    """Each token call of one attempt: its class, parent sequence and why (the converter's rollout graph)."""
    records = group.records.get(rollout_id)
    if records is None or attempt_id is None:
        return {}
    bundle = next((b for b in records.attempts if b.attempt.attempt_id == attempt_id), None)
    return {} if bundle is None else label_calls(bundle.calls)


def _segment_view(index: int, segment: TrajectorySegment, texts: TokenTexts, full: bool) -> SegmentView:
    n = len(segment.input_ids)
    start, end = 0, n
    if not full:
        first_trained = segment.calls[0].response_start if segment.calls else n
        start = max(0, first_trained - CONTEXT_SHOWN)
        end = min(n, start + MAX_TOKENS_SHOWN)
    return SegmentView(index, segment, token_markup(segment, start, end, texts), start, end)


def token_markup(segment: TrajectorySegment, start: int, end: int, texts: TokenTexts) -> Markup:
    """The spans of tokens [start, end) with call markers and attributed rewards in place."""
    ids = segment.input_ids
    mask, logprobs, versions = segment.loss_mask, segment.sampler_logprobs, segment.policy_versions
    shown = texts.texts(ids[start:end])
    opens: dict[int, list[str]] = {}
    closes: dict[int, list[str]] = {}
    for call in segment.calls:
        label = f"call #{call.sequence}" + (f"/{call.choice_index}" if call.choice_index else "")
        if call.agent_name:
            label += f" · {call.agent_name}"
        opens.setdefault(call.response_start, []).append(
            f'<span class="callmark" data-seq="{call.sequence}">{escape(label)}</span>'
        )
        if call.rewards:
            values = ", ".join(f"{name} {value:+g}" for name, value in call.rewards.items())
            closes.setdefault(call.response_end, []).append(
                f'<span class="rewardmark" title="rewards attributed to this call">{escape(values)}</span>'
            )
    parts: list[str] = []
    for i in range(start, end):
        parts.extend(closes.get(i, ()))
        parts.extend(opens.get(i, ()))
        token_id = ids[i]
        text = f"⟨{token_id}⟩" if shown is None else _visible(shown[i - start])
        classes = "tok m1" if mask[i] else "tok m0"
        if texts.is_special(token_id):
            classes += " sp"
        attributes = f'class="{classes}" data-i="{i}" data-id="{token_id}" data-m="{mask[i]}"'
        if mask[i]:
            attributes += f' data-lp="{logprobs[i]!r}" data-v="{versions[i]}"'
        parts.append(f"<span {attributes}>{escape(text)}</span>")
    if end == len(ids):
        parts.extend(closes.get(end, ()))
        parts.extend(opens.get(end, ()))
    return Markup("".join(parts))


def _visible(text: str) -> str:
    """Token text with line breaks and tabs made visible (the break itself is kept)."""
    if not text:
        return "∅"
    return text.replace("\t", "⇥").replace("\n", "↵\n")
