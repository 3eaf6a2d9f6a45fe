"""`convert_attempt`: one attempt's calls and rewards → a `Trajectory`, or the `DropReason` it has none.

A pure function (no store, no I/O), so every rule is unit-testable; `convert_store` applies it to
each attempt it streams. In order:
  1. Only a succeeded attempt trains: failed → FAILED, timed_out → TIMED_OUT, running → NOT_FINISHED.
  2. Calls are taken in (sequence, choice_index) order and classified (`graph.build_graph`: main,
     retry, side, compaction, subagent); those that train are the token calls the options select
     (`policy.skip_reason`) of a class in `options.train_classes`; the others are listed in
     `excluded_calls` with their class and why. None → NO_TRAINABLE_CALLS (before looking at
     rewards: there is nothing a reward could score).
  3. No reward at all → the `missing_reward` policy: drop (MISSING_REWARD), zero (return 0.0,
     `missing_reward=True`), or error (MissingRewardError).
  4. Rewards are attributed to calls (`attribution`), calls merged into segments (`merge`), and
     the return is the weighted sum of the reward totals by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agl_bridge import semconv
from agl_bridge.convert.attribution import attribute_rewards
from agl_bridge.convert.errors import MissingRewardError
from agl_bridge.convert.graph import RolloutGraph, build_graph
from agl_bridge.convert.merge import merge_calls
from agl_bridge.convert.policy import DEFAULT_OPTIONS, ConvertOptions, skip_reason, weighted_return
from agl_bridge.convert.records import DropReason, ExcludedCall, Trajectory
from agl_bridge.types import AttemptStatus, LLMCall, Reward

_STATUS_DROPS = {
    AttemptStatus.FAILED: DropReason.FAILED,
    AttemptStatus.TIMED_OUT: DropReason.TIMED_OUT,
    AttemptStatus.RUNNING: DropReason.NOT_FINISHED,
}


def convert_attempt(
    calls: Sequence[LLMCall],
    rewards: Sequence[Reward],
    attempt_status: AttemptStatus | str,
    options: ConvertOptions = DEFAULT_OPTIONS,
    *,
    rollout_id: str | None = None,
    attempt_id: str | None = None,
    group_id: str | None = None,
    task: Any = None,
) -> Trajectory | DropReason:
    """Convert one attempt (see the module doc for the rules).

    calls / rewards: the attempt's records, any order; each needs its store `sequence`. Rewards
      with `attempt_id` None are the rollout's own (recorded outside any attempt) and attach to no
      call.
    rollout_id / attempt_id: default to the ones the records carry; ValueError if records of
      another rollout or attempt are mixed in, or if no record names them.
    group_id / task: copied onto the trajectory (the rollout's GRPO group and task payload).
    """
    status = AttemptStatus(attempt_status)
    rollout_id, attempt_id = _identify(calls, rewards, rollout_id, attempt_id)
    drop = _STATUS_DROPS.get(status)
    if drop is not None:
        return drop
    ordered = sorted(calls, key=_call_order)
    graph = build_graph(ordered)
    trainable, excluded = _select(ordered, graph, options)
    if not trainable:
        return DropReason.NO_TRAINABLE_CALLS
    if not rewards:
        if options.missing_reward == "drop":
            return DropReason.MISSING_REWARD
        if options.missing_reward == "error":
            raise MissingRewardError(rollout_id, attempt_id)
    attribution = attribute_rewards(trainable, rewards)
    return Trajectory(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        group_id=group_id,
        task=task,
        reward=weighted_return(attribution.totals, options),
        rewards=attribution.totals,
        unattached_rewards=attribution.unattached,
        missing_reward=not rewards,
        segments=merge_calls(trainable, attribution.by_call, graph),
        excluded_calls=excluded,
        graph_warnings=graph.warnings,
    )


def _select(
    ordered: list[LLMCall], graph: RolloutGraph, options: ConvertOptions
) -> tuple[list[LLMCall], list[ExcludedCall]]:
    """The token calls that train, in order, and the others with their class and why they do not."""
    trainable: list[LLMCall] = []
    excluded: list[ExcludedCall] = []
    filters = options.models is not None or options.agent_names is not None
    for call in ordered:
        if call.kind != semconv.CALL_KIND_TOKEN:
            continue
        node = graph.nodes[(call.sequence, call.choice_index)]  # type: ignore[index]  # checked in _identify
        if node.call_class in options.train_classes and (not filters or skip_reason(call, options) is None):
            trainable.append(call)
            continue
        why = (
            f"{node.call_class.value} calls do not train (train_classes: "
            f"{', '.join(sorted(c.value for c in options.train_classes))}); {node.reason}"
            if node.call_class not in options.train_classes
            else "another model or agent than the options select"
        )
        excluded.append(
            ExcludedCall(
                sequence=call.sequence,  # type: ignore[arg-type]  # checked in _identify
                choice_index=call.choice_index,
                call_class=node.call_class,
                parent_sequence=None if node.parent is None else node.parent[0],
                reason=why,
            )
        )
    return trainable, excluded


def _call_order(call: LLMCall) -> tuple[int, int]:
    return (call.sequence, call.choice_index)  # type: ignore[return-value]  # checked in _identify


def _identify(
    calls: Sequence[LLMCall], rewards: Sequence[Reward], rollout_id: str | None, attempt_id: str | None
) -> tuple[str, str]:
    """The (rollout, attempt) the records belong to; ValueError naming the first record that disagrees."""
    if rollout_id is None or attempt_id is None:
        every: tuple[LLMCall | Reward, ...] = (*calls, *rewards)
        if rollout_id is None:
            rollout_id = next((record.rollout_id for record in every), None)
        if attempt_id is None:
            attempt_id = next((r.attempt_id for r in every if r.attempt_id is not None), None)
    if rollout_id is None or attempt_id is None:
        raise ValueError(
            "cannot tell which rollout and attempt these records belong to (none names them); "
            "pass rollout_id= and attempt_id="
        )
    for what, records in (("call", calls), ("reward", rewards)):
        for record in records:
            if record.sequence is None:
                raise ValueError(
                    f"a {what} without a sequence cannot be ordered; pass the records as the store returns "
                    "them (the store allocates each record's sequence)"
                )
            # A reward without an attempt is the rollout's own; every other record must match both ids.
            if record.rollout_id != rollout_id or (
                record.attempt_id != attempt_id and (what == "call" or record.attempt_id is not None)
            ):
                raise ValueError(
                    f"a {what} of rollout {record.rollout_id!r} attempt {record.attempt_id!r} was passed with "
                    f"the records of rollout {rollout_id!r} attempt {attempt_id!r}; convert one attempt at a time"
                )
    return rollout_id, attempt_id
