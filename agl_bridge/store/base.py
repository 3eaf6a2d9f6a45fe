"""The async store contract every backend implements (SQLite now, Postgres later).

A store holds rollouts and their attempts (with the rollout state machine), allocates sequence
numbers, and persists LLM calls, rewards and generic spans (agent/tool/framework spans received
over OTLP). Writes return only once the record is durable; reads stream in order so a converter
can walk millions of records in bounded memory.

Ordering: records are grouped by (rollout, attempt) and come in ascending `sequence` within each
group (LLM calls: then `choice_index`). Calls, rewards and generic spans share a sequence space
per (rollout, attempt); records outside any rollout share one "no rollout" space.

`iter_rollout_records` is the read a converter uses: one rollout at a time with its attempts and
their calls and rewards, so memory holds one rollout whatever the store holds.

Every rollout the store sees is a rollout in it: the first record under a (rollout, attempt) it
has no row for registers both as running (origin external), in the write that stores the record.
Clients we do not launch then drive the rest of the lifecycle (`register_attempt`,
`report_reward`, `complete_attempt`; `expire_idle_rollouts` ends what nobody finishes), and a
follow trainer takes finished rollouts (`mark_consumed`, `release_consumed`, `change_token` + `wait_for_change`).
Attempt ids are unique per rollout; `tests/store/test_store_contract.py` holds what every backend
must do, parametrized by backend.

One store object serves every event loop and thread of its process, whichever loop opened it
(`tests/store/test_store_shared.py`): open and close it on one loop; the others use it in between.
A process keeps one store object per store: the trainer uses its in-process proxy's rather than
opening a second writer on the same file.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

from agl_bridge.types import (
    Attempt,
    AttemptRecords,
    AttemptStatus,
    LLMCall,
    Reward,
    Rollout,
    RolloutRecords,
    RolloutStatus,
    RolloutTask,
    StoredSpan,
)


@runtime_checkable
class Store(Protocol):
    """Async persistence for rollouts, attempts, LLM calls, rewards and generic spans."""

    async def open(self) -> None:
        """Open (creating if needed) the store; raises StoreSchemaError for a foreign/old file."""
        ...

    async def close(self) -> None:
        """Commit every write already submitted, then release the store's resources."""
        ...

    async def __aenter__(self) -> Store:
        """Open the store and return it."""
        ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Close the store."""
        ...

    # --- rollouts and attempts ------------------------------------------------------------------

    async def create_rollout(
        self,
        task: Any,
        *,
        group_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        rollout_id: str | None = None,
    ) -> Rollout:
        """Create a queued rollout of a JSON-able `task`; a fresh id is made when none is given."""
        ...

    async def get_rollout(self, rollout_id: str) -> Rollout | None:
        """The rollout with this id, or None."""
        ...

    async def list_rollouts(
        self,
        *,
        status: RolloutStatus | Iterable[RolloutStatus] | None = None,
        group_id: str | None = None,
        limit: int | None = None,
        eval: bool | None = None,
        consumed: bool | None = None,
        created_since: float | None = None,
    ) -> list[Rollout]:
        """Rollouts in creation order, filtered by status (one or several), group, eval flag, whether a
        follow trainer took them, and creation time (at or after `created_since`)."""
        ...

    async def set_rollout_status(self, rollout_id: str, status: RolloutStatus) -> Rollout:
        """Move a rollout along the state machine; InvalidTransitionError if illegal."""
        ...

    async def start_attempt(self, rollout_id: str) -> Attempt:
        """Start the next attempt of a queued or running rollout (the rollout becomes running)."""
        ...

    async def finish_attempt(
        self,
        attempt_id: str,
        status: AttemptStatus,
        *,
        error: str | None = None,
        traceback: str | None = None,
        rollout_id: str | None = None,
    ) -> Attempt:
        """Record a running attempt's outcome (the rollout's own status is set separately).

        rollout_id: the attempt's rollout; needed only when several rollouts use this attempt id.
        """
        ...

    async def get_attempt(self, attempt_id: str, rollout_id: str | None = None) -> Attempt | None:
        """The attempt with this id (of `rollout_id`, when given), or None."""
        ...

    # --- rollouts run by clients we do not launch -----------------------------------------------

    async def register_attempt(self, rollout_id: str, attempt_id: str, task: RolloutTask | None = None) -> Rollout:
        """Start (rollout, attempt) for an outside harness, naming its task; registered as running if new.

        AttemptFinishedError if the attempt or its rollout is finished; TaskConflictError if the
        rollout belongs to another task.
        """
        ...

    async def complete_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        status: AttemptStatus,
        *,
        error: str | None = None,
        task: RolloutTask | None = None,
    ) -> Rollout:
        """Finish an attempt (naming its task first); once none of its attempts runs, the rollout ends:
        succeeded if any attempt succeeded, else this outcome. AttemptNotFoundError,
        AttemptFinishedError, TaskConflictError."""
        ...

    async def report_reward(self, reward: Reward) -> int:
        """Store a reward for a live attempt (registered if new); AttemptFinishedError if it is finished."""
        ...

    async def expire_idle_rollouts(self, idle_s: float) -> list[tuple[str, str | None]]:
        """Time out external rollouts idle (no record or request) for `idle_s`; the (rollout, attempt)s ended."""
        ...

    async def mark_consumed(self, rollout_ids: Sequence[str], step: int) -> int:
        """Mark rollouts as taken by a follow trainer's step `step`; returns how many were not taken yet."""
        ...

    async def release_consumed(self, after_step: int) -> int:
        """Un-take what steps after `after_step` took (resuming from that checkpoint); returns how many."""
        ...

    async def change_token(self) -> int:
        """A mark of the store's state now; take it before reading what `wait_for_change(since=...)` waits on."""
        ...

    async def wait_for_change(self, timeout_s: float, *, since: int | None = None, poll_s: float = 0.25) -> bool:
        """Wait for a possible rollout or attempt change (False after `timeout_s` without one); never spins.

        since: a `change_token()`; a change committed after it (even before this call) returns at once.
        """
        ...

    async def list_attempts(self, rollout_id: str) -> list[Attempt]:
        """A rollout's attempts, first to last."""
        ...

    # --- sequence numbers and records -----------------------------------------------------------

    async def next_sequence(self, rollout_id: str | None, attempt_id: str | None) -> int:
        """Allocate the next sequence number of (rollout, attempt); durable, never repeated."""
        ...

    async def add_llm_call(self, call: LLMCall) -> int:
        """Durably store one call; returns its sequence (allocated if `call.sequence` is None)."""
        ...

    async def add_llm_calls(self, calls: Sequence[LLMCall]) -> list[int]:
        """Durably store several calls; returns their sequences in order."""
        ...

    async def add_reward(self, reward: Reward) -> int:
        """Durably store one reward; returns its sequence (allocated if `reward.sequence` is None)."""
        ...

    async def add_rewards(self, rewards: Sequence[Reward]) -> list[int]:
        """Durably store several rewards; returns their sequences in order."""
        ...

    async def add_span(self, span: StoredSpan) -> int:
        """Durably store one generic span; returns its sequence (a re-delivered span_id is a no-op)."""
        ...

    async def add_spans(self, spans: Sequence[StoredSpan]) -> list[int]:
        """Durably store several generic spans; returns their sequences in order."""
        ...

    def iter_llm_calls(self, rollout_id: str | None = None, attempt_id: str | None = None) -> AsyncIterator[LLMCall]:
        """Stream the calls of a rollout (or of one attempt; or of all rollouts when None) in order."""
        ...

    def iter_rewards(self, rollout_id: str | None = None, attempt_id: str | None = None) -> AsyncIterator[Reward]:
        """Stream the rewards of a rollout (or of one attempt; or of all rollouts when None) in order."""
        ...

    def iter_spans(self, rollout_id: str | None = None, attempt_id: str | None = None) -> AsyncIterator[StoredSpan]:
        """Stream the generic spans of a rollout (or of one attempt; or of all rollouts when None) in order."""
        ...

    def iter_all_calls(self) -> AsyncIterator[LLMCall]:
        """Stream every call, those outside any rollout first, for exports."""
        ...

    def iter_all_rewards(self) -> AsyncIterator[Reward]:
        """Stream every reward, those outside any rollout first."""
        ...

    def iter_all_spans(self) -> AsyncIterator[StoredSpan]:
        """Stream every generic span, those outside any rollout first."""
        ...

    def iter_rollout_records(
        self, rollout_ids: Iterable[str] | None = None, *, tokens_only: bool = False
    ) -> AsyncIterator[RolloutRecords]:
        """Stream rollouts one at a time, each with its attempts and their calls and rewards.

        rollout_ids None: every rollout the store has a row for, in rollout id order (records of
        rollouts without a row are not included); given: those rollouts in that order, duplicates
        once, RolloutNotFoundError when an unknown id is reached. Records are grouped as
        `group_rollout_records` does. tokens_only=True is for readers that need only the tokens
        (the converter): each call's token fields may then be `array.array`s instead of lists,
        its messages empty and its text, timing, trace and usage fields None.
        """
        ...


def group_rollout_records(
    rollout: Rollout, attempts: Sequence[Attempt], calls: Iterable[LLMCall], rewards: Iterable[Reward]
) -> RolloutRecords:
    """Bundle one rollout's records by attempt (attempts sorted by number; record order is kept).

    Records whose attempt is not one of `attempts` (none, or one the store has no row for) go to
    `other_calls` / `other_rewards`.
    """
    by_attempt = {
        attempt.attempt_id: AttemptRecords(attempt=attempt)
        for attempt in sorted(attempts, key=lambda attempt: attempt.number)
    }
    grouped = RolloutRecords(rollout=rollout, attempts=list(by_attempt.values()))
    for call in calls:
        bundle = by_attempt.get(call.attempt_id) if call.attempt_id is not None else None
        (grouped.other_calls if bundle is None else bundle.calls).append(call)
    for reward in rewards:
        bundle = by_attempt.get(reward.attempt_id) if reward.attempt_id is not None else None
        (grouped.other_rewards if bundle is None else bundle.rewards).append(reward)
    return grouped
