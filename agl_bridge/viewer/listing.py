"""The rollout lists: filter, sort and paginate in SQL, then fill in the page's rows.

Two queries per page: the first picks the page's rollout ids (filters and sort key computed by
SQLite, with the rollout's return from the `agl_return` aggregate only when a filter or the sort
needs it), the second set reads what the table shows for just those ids. A rollout's rewards and
return are its final attempt's plus the ones recorded for the rollout outside any attempt — the
attempt its outcome is about, as the converter scores it — weighted as the run weighs them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agl_bridge.convert import ConvertOptions
from agl_bridge.convert.policy import weighted_return
from agl_bridge.store.codec import decode_json, encode_json
from agl_bridge.store.sqlite_rows import NO_ID
from agl_bridge.types import Attempt, Rollout, RolloutStatus
from agl_bridge.viewer.records import Reader, get_attempts, get_rollouts, marks
from agl_bridge.viewer.steps import EVAL, TRAIN, StepRef, step_of, train_group_range

PAGE_SIZE = 50

RETURN_FUNCTION = "agl_return"
"""SQL aggregate `agl_return(name, value)`: the weighted return of rewards (NULL for none)."""

_FINAL_ATTEMPT = (
    "(SELECT a.attempt_id FROM attempts a WHERE a.rollout_id = r.rollout_id ORDER BY a.number DESC LIMIT 1)"
)
_RETURN = (
    f"(SELECT {RETURN_FUNCTION}(w.name, w.value) FROM rewards w WHERE w.rollout_key = r.rollout_id "
    f"AND (w.attempt_key = '' OR w.attempt_key = {_FINAL_ATTEMPT}))"
)
_CALLS = "(SELECT count(*) FROM llm_calls c WHERE c.rollout_key = r.rollout_id)"
_DURATION = "(SELECT max(a.ended_at) - min(a.started_at) FROM attempts a WHERE a.rollout_id = r.rollout_id)"

SORTS: dict[str, str] = {
    "created": "r.rowid",
    "updated": "r.updated_at",
    "status": "r.status",
    "task": "r.task",
    "group": "r.group_id",
    "attempts": "r.attempts",
    "return": _RETURN,
    "calls": _CALLS,
    "duration": _DURATION,
}
"""Sortable columns and their SQL."""

_KIND_PATTERNS = {TRAIN: "s[0-9]*-[0-9]*", EVAL: "eval[0-9]*-*"}
STATUSES = tuple(status.value for status in RolloutStatus)


def return_aggregate(options: ConvertOptions) -> type:
    """The `agl_return` aggregate class for `options` (register with `Connection.create_aggregate`)."""

    class WeightedReturn:
        def __init__(self) -> None:
            self.totals: dict[str, float] = {}

        def step(self, name: str, value: float) -> None:
            self.totals[name] = self.totals.get(name, 0.0) + value

        def finalize(self) -> float | None:
            return weighted_return(self.totals, options) if self.totals else None

    return WeightedReturn


class FilterError(ValueError):
    """A filter value in the URL cannot be used; the message names the parameter."""


@dataclass(frozen=True, slots=True)
class RolloutQuery:
    """What a rollout list shows: filters, sort and page (every field is a URL parameter)."""

    status: str | None = None
    step: int | None = None
    group: str | None = None
    kind: str | None = None
    text: str | None = None
    model: str | None = None
    agent: str | None = None
    return_min: float | None = None
    return_max: float | None = None
    sort: str = "created"
    descending: bool = True
    page: int = 1

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> RolloutQuery:
        """Parse URL query parameters; FilterError naming the bad one."""

        def text(name: str) -> str | None:
            value = params.get(name, "").strip()
            return value or None

        def number(name: str, kind: type[int] | type[float]) -> Any:
            value = text(name)
            if value is None:
                return None
            try:
                return kind(value)
            except ValueError:
                raise FilterError(
                    f"{name} must be {'an integer' if kind is int else 'a number'}, got {value!r}"
                ) from None

        status, kind, sort = text("status"), text("kind"), text("sort") or "created"
        if status is not None and status not in STATUSES:
            raise FilterError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
        if kind is not None and kind not in _KIND_PATTERNS:
            raise FilterError(f"kind must be {TRAIN} or {EVAL}, got {kind!r}")
        if sort not in SORTS:
            raise FilterError(f"sort must be one of {', '.join(SORTS)}, got {sort!r}")
        page = number("page", int)
        page = 1 if page is None else page
        if page < 1:
            raise FilterError(f"page must be >= 1, got {page}")
        return cls(
            status=status,
            step=number("step", int),
            group=text("group"),
            kind=kind,
            text=text("q"),
            model=text("model"),
            agent=text("agent"),
            return_min=number("min", float),
            return_max=number("max", float),
            sort=sort,
            descending=params.get("order", "desc") != "asc",
            page=page,
        )

    def params(self, **changes: Any) -> dict[str, str]:
        """URL parameters of this query with `changes` applied (only the set ones)."""
        values = {
            "status": self.status,
            "step": self.step,
            "group": self.group,
            "kind": self.kind,
            "q": self.text,
            "model": self.model,
            "agent": self.agent,
            "min": self.return_min,
            "max": self.return_max,
            "sort": None if self.sort == "created" else self.sort,
            "order": None if self.descending else "asc",
            "page": None if self.page == 1 else self.page,
        }
        values.update(changes)
        return {key: str(value) for key, value in values.items() if value is not None and value != ""}

    def where(self) -> tuple[str, list[Any]]:
        """The SQL condition on `rollouts r` and its arguments."""
        conditions: list[str] = []
        args: list[Any] = []
        if self.status is not None:
            conditions.append("r.status = ?")
            args.append(self.status)
        if self.step is not None:
            low, high = train_group_range(self.step)
            conditions.append("r.group_id >= ? AND r.group_id < ?")
            args += [low, high]
        if self.group is not None:
            conditions.append("r.group_id = ?")
            args.append(self.group)
        if self.kind is not None:
            conditions.append("r.group_id GLOB ?")
            args.append(_KIND_PATTERNS[self.kind])
        if self.text is not None:
            escaped = self.text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            conditions.append("(r.task LIKE ? ESCAPE '\\' OR r.rollout_id LIKE ? ESCAPE '\\')")
            args += [f"%{escaped}%"] * 2
        for column, value in (("model", self.model), ("agent_name", self.agent)):
            if value is not None:
                conditions.append(
                    f"EXISTS (SELECT 1 FROM llm_calls c WHERE c.rollout_key = r.rollout_id AND c.{column} = ?)"
                )
                args.append(value)
        if self.return_min is not None:
            conditions.append(f"{_RETURN} >= ?")
            args.append(self.return_min)
        if self.return_max is not None:
            conditions.append(f"{_RETURN} <= ?")
            args.append(self.return_max)
        return (" WHERE " + " AND ".join(conditions)) if conditions else "", args


@dataclass(slots=True)
class RolloutRow:
    """One rollout as the lists show it."""

    rollout: Rollout
    attempts: list[Attempt]
    rewards: dict[str, float] = field(default_factory=dict)
    ret: float | None = None
    calls: int = 0
    models: list[str] = field(default_factory=list)
    agents: list[str] = field(default_factory=list)
    versions: tuple[int, int] | None = None
    advantage: str = ""
    """Filled in by the caller from the trainer's advantages (see trained.py)."""

    @property
    def final_attempt(self) -> Attempt | None:
        """The attempt the rollout's outcome is about."""
        return self.attempts[-1] if self.attempts else None

    @property
    def duration_s(self) -> float | None:
        """From the first attempt's start to the last attempt's end (None while one runs)."""
        if not self.attempts or any(a.ended_at is None for a in self.attempts):
            return None
        return max(a.ended_at or 0.0 for a in self.attempts) - min(a.started_at for a in self.attempts)


@dataclass(slots=True)
class RolloutPage:
    """One page of a rollout list."""

    query: RolloutQuery
    rows: list[RolloutRow]
    total: int

    @property
    def pages(self) -> int:
        """How many pages the list has (at least 1)."""
        return max(1, -(-self.total // PAGE_SIZE))


def list_rollouts(
    conn: Reader, query: RolloutQuery, options: ConvertOptions, page_size: int = PAGE_SIZE
) -> RolloutPage:
    """The page `query` asks for."""
    where, args = query.where()
    total = conn.execute(f"SELECT count(*) FROM rollouts r{where}", args).fetchone()[0]
    direction = "DESC" if query.descending else "ASC"
    rows = conn.execute(
        f"SELECT r.rollout_id FROM rollouts r{where} ORDER BY {SORTS[query.sort]} {direction} NULLS LAST, "
        f"r.rowid {direction} LIMIT ? OFFSET ?",
        [*args, page_size, (query.page - 1) * page_size],
    ).fetchall()
    return RolloutPage(query, rollout_rows(conn, [row[0] for row in rows], options), total)


def rollout_rows(conn: Reader, rollout_ids: list[str], options: ConvertOptions) -> list[RolloutRow]:
    """The table rows of `rollout_ids` (in that order)."""
    rollouts = get_rollouts(conn, rollout_ids)
    attempts = get_attempts(conn, rollout_ids)
    rows = {i: RolloutRow(rollouts[i], attempts.get(i, [])) for i in rollout_ids if i in rollouts}
    if not rows:
        return []
    ids = list(rows)
    for rollout_id, count, low, high, models, agents in conn.execute(
        "SELECT rollout_key, count(*), min(policy_version), max(policy_version), "
        "group_concat(DISTINCT model), group_concat(DISTINCT agent_name) "
        f"FROM llm_calls WHERE rollout_key IN ({marks(ids)}) GROUP BY rollout_key",
        ids,
    ):
        row = rows[rollout_id]
        row.calls = count
        row.versions = None if low is None else (low, high)
        row.models = sorted(models.split(",")) if models else []
        row.agents = sorted(agents.split(",")) if agents else []
    final = {i: (row.final_attempt.attempt_id if row.final_attempt else None) for i, row in rows.items()}
    for rollout_id, attempt, name, value in conn.execute(
        f"SELECT rollout_key, attempt_key, name, value FROM rewards WHERE rollout_key IN ({marks(ids)}) "
        "ORDER BY rollout_key, attempt_key, sequence",
        ids,
    ):
        if attempt == NO_ID or attempt == final[rollout_id]:
            totals = rows[rollout_id].rewards
            totals[name] = totals.get(name, 0.0) + value
    for row in rows.values():
        row.ret = weighted_return(row.rewards, options) if row.rewards else None
    return list(rows.values())


@dataclass(slots=True)
class GroupSummary:
    """A group's rollouts by status, and its task."""

    group_id: str
    task: Any
    rollouts: int
    by_status: dict[str, int]

    @property
    def step(self) -> StepRef | None:
        """The step the group belongs to."""
        return step_of(self.group_id)


def groups(conn: Reader, low: str | None = None, high: str | None = None) -> list[GroupSummary]:
    """Every group (or those with low <= group id < high), in group id order."""
    where, args = (
        ("WHERE group_id IS NOT NULL", []) if low is None else ("WHERE group_id >= ? AND group_id < ?", [low, high])
    )
    summaries: dict[str, GroupSummary] = {}
    for group_id, status, count, task in conn.execute(
        f"SELECT group_id, status, count(*), min(task) FROM rollouts {where} "
        "GROUP BY group_id, status ORDER BY group_id",
        args,
    ):
        summary = summaries.get(group_id)
        if summary is None:
            summary = summaries[group_id] = GroupSummary(group_id, decode_json(task), 0, {})
        summary.rollouts += count
        summary.by_status[status] = count
    return list(summaries.values())


@dataclass(slots=True)
class StoreCounts:
    """Totals of a store, for the runs page."""

    rollouts: int
    by_status: dict[str, int]
    calls: int
    rewards: int
    spans: int


def store_counts(conn: Reader) -> StoreCounts:
    """How much the store holds."""
    by_status = dict(conn.execute("SELECT status, count(*) FROM rollouts GROUP BY status").fetchall())
    return StoreCounts(
        rollouts=sum(by_status.values()),
        by_status=by_status,
        calls=conn.execute("SELECT count(*) FROM llm_calls").fetchone()[0],
        rewards=conn.execute("SELECT count(*) FROM rewards").fetchone()[0],
        spans=conn.execute("SELECT count(*) FROM spans").fetchone()[0],
    )


def same_task(conn: Reader, rollout: Rollout, limit: int = 20) -> list[tuple[str, str | None, str]]:
    """Other rollouts of the same task (rollout id, group id, status), oldest first."""
    rows = conn.execute(
        "SELECT rollout_id, group_id, status FROM rollouts WHERE task = ? AND rollout_id != ? ORDER BY rowid LIMIT ?",
        (encode_json("task", rollout.task), rollout.rollout_id, limit),
    ).fetchall()
    return [(row[0], row[1], row[2]) for row in rows]
