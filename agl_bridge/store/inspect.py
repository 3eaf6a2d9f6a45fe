"""Summaries of what a store holds, for `agl-bridge inspect`: built here, rendered as rich tables or JSON.

Two views:
  - `store_overview`: one row per rollout (status, who started it — our runner or a client we do
    not launch —, group, attempts, calls, rewards, reward sum, creation time) plus the number of
    calls and rewards recorded outside any rollout. Every rollout the proxy saw has a row: its
    first call or reward registered it;
  - `rollout_detail`: one rollout's attempts, each with its calls and rewards in sequence order;
    given a `CallClassifier` (the CLI passes the converter's rollout graph: the store knows nothing
    of it), each call's class, parent call and why.

Only the public `Store` API is used, so this works for any backend. Counts come from streaming the
records of each rollout shown (bounded memory, but time grows with the records of those rollouts);
`limit` bounds the rollouts listed, and in the detail view the records listed per attempt (the
counts and sums still cover every record).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from agl_bridge.export_files import closing_stream
from agl_bridge.store.base import Store
from agl_bridge.store.errors import RolloutNotFoundError
from agl_bridge.store.export import LLM_CALL_KIND, REWARD_KIND, merge_in_sequence
from agl_bridge.types import Attempt, LLMCall, Reward, Rollout

PREVIEW_CHARS = 60
"""How much of a call's response text the detail view shows."""

CallLabel = tuple[str, int | None, str]
"""What a classifier says of a call: its class, its parent call's sequence (None for a root), why."""

CallClassifier = Callable[[list[LLMCall]], Mapping[tuple[int, int], CallLabel]]
"""Labels one attempt's calls (all of them, in sequence order) by (sequence, choice_index)."""


@dataclass(slots=True)
class RolloutRow:
    """One rollout of the overview: its state and what was recorded for it."""

    rollout_id: str
    status: str
    group_id: str | None
    attempts: int
    calls: int
    rewards: int
    reward_sum: float | None  # None when no reward was recorded: a missing reward is not a zero
    created_at: float
    origin: str = "runner"  # who started it: "runner", or "external" (registered by its first record or request)
    eval: bool = False  # a held-out rollout: evaluated, never trained


@dataclass(slots=True)
class StoreOverview:
    """Rollouts in creation order (at most `limit`) and the records made outside any rollout."""

    store: str
    rollouts: list[RolloutRow]
    more_rollouts: bool
    calls_without_rollout: int
    rewards_without_rollout: int

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict of the overview."""
        return asdict(self)


@dataclass(slots=True)
class CallLine:
    """One LLM call as the detail view lists it."""

    sequence: int
    choice_index: int
    model: str
    call_kind: str
    prompt_tokens: int
    response_tokens: int
    finish_reason: str | None
    policy_version: int | None
    response_preview: str | None
    prefix_breaks: int
    kind: str = LLM_CALL_KIND
    call_class: str | None = None
    parent_sequence: int | None = None
    class_reason: str | None = None

    @classmethod
    def of(cls, call: LLMCall) -> CallLine:
        """Summarise a stored call."""
        text = call.response_text
        return cls(
            sequence=call.sequence or 0,
            choice_index=call.choice_index,
            model=call.model,
            call_kind=call.kind,
            prompt_tokens=len(call.prompt_token_ids),
            response_tokens=len(call.response_token_ids),
            finish_reason=call.finish_reason,
            policy_version=call.policy_version,
            response_preview=None if text is None else text[:PREVIEW_CHARS],
            prefix_breaks=len(call.prefix_breaks),
        )


@dataclass(slots=True)
class RewardLine:
    """One reward as the detail view lists it."""

    sequence: int
    name: str
    value: float
    kind: str = REWARD_KIND


@dataclass(slots=True)
class AttemptDetail:
    """One attempt (or the rollout's records made outside any attempt, `attempt_id` None).

    `number`/`status` are None for records whose attempt the store has no row for (ingested
    from a runner that did not register it). `records` holds at most the limit; `truncated` says
    whether more exist, and the counts and `reward_sum` cover all of them.
    """

    attempt_id: str | None
    number: int | None = None
    status: str | None = None
    error: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    calls: int = 0
    rewards: int = 0
    reward_sum: float | None = None
    truncated: bool = False
    records: list[CallLine | RewardLine] = field(default_factory=list)

    @classmethod
    def of(cls, attempt: Attempt) -> AttemptDetail:
        """An attempt with no records yet."""
        return cls(
            attempt_id=attempt.attempt_id,
            number=attempt.number,
            status=attempt.status.value,
            error=attempt.error,
            started_at=attempt.started_at,
            ended_at=attempt.ended_at,
        )

    def add(self, record: LLMCall | Reward, limit: int | None) -> None:
        """Count `record` and list it unless `limit` records are listed already."""
        if isinstance(record, LLMCall):
            self.calls += 1
            line: CallLine | RewardLine = CallLine.of(record)
        else:
            self.rewards += 1
            self.reward_sum = (self.reward_sum or 0.0) + record.value
            line = RewardLine(sequence=record.sequence or 0, name=record.name, value=record.value)
        if limit is None or len(self.records) < limit:
            self.records.append(line)
        else:
            self.truncated = True


@dataclass(slots=True)
class RolloutDetail:
    """One rollout (`rollout` None if only its records are stored) and its attempts in order."""

    rollout_id: str
    rollout: RolloutRow | None
    task: Any
    attempts: list[AttemptDetail]

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict of the detail view."""
        return asdict(self)


async def _count_calls(store: Store, rollout_id: str) -> int:
    count = 0
    async with closing_stream(store.iter_llm_calls(rollout_id)) as calls:
        async for _ in calls:
            count += 1
    return count


async def _count_rewards(store: Store, rollout_id: str) -> tuple[int, float | None]:
    count, total = 0, None
    async with closing_stream(store.iter_rewards(rollout_id)) as rewards:
        async for reward in rewards:
            count += 1
            total = (total or 0.0) + reward.value
    return count, total


async def _rollout_row(store: Store, rollout: Rollout) -> RolloutRow:
    calls = await _count_calls(store, rollout.rollout_id)
    rewards, reward_sum = await _count_rewards(store, rollout.rollout_id)
    return _row_of(rollout, calls, rewards, reward_sum)


def _row_of(rollout: Rollout, calls: int, rewards: int, reward_sum: float | None) -> RolloutRow:
    return RolloutRow(
        rollout_id=rollout.rollout_id,
        status=rollout.status.value,
        group_id=rollout.group_id,
        attempts=rollout.attempts,
        calls=calls,
        rewards=rewards,
        reward_sum=reward_sum,
        created_at=rollout.created_at,
        origin=rollout.origin.value,
        eval=rollout.eval,
    )


async def _count_unattributed(stream: Any) -> int:
    # The all-records streams yield the records outside any rollout first: stop at the first other.
    count = 0
    async with closing_stream(stream) as records:
        async for record in records:
            if record.rollout_id is not None:
                break
            count += 1
    return count


async def store_overview(store: Store, *, limit: int | None = None, name: str = "") -> StoreOverview:
    """Summarise the first `limit` rollouts (all when None) and the records outside any rollout."""
    listed = await store.list_rollouts(limit=None if limit is None else limit + 1)
    more = limit is not None and len(listed) > limit
    rows = [await _rollout_row(store, rollout) for rollout in listed[:limit]]
    return StoreOverview(
        store=name,
        rollouts=rows,
        more_rollouts=more,
        calls_without_rollout=await _count_unattributed(store.iter_all_calls()),
        rewards_without_rollout=await _count_unattributed(store.iter_all_rewards()),
    )


async def rollout_detail(
    store: Store, rollout_id: str, *, limit: int | None = None, classify: CallClassifier | None = None
) -> RolloutDetail:
    """One rollout's attempts with their calls and rewards interleaved in sequence order.

    `limit` bounds the records listed per attempt. With `classify`, each attempt's calls (all of
    them, listed or not) are labelled with their class and parent. Raises RolloutNotFoundError when
    the store has neither the rollout nor any record for it.
    """
    rollout = await store.get_rollout(rollout_id)
    known = {attempt.attempt_id: AttemptDetail.of(attempt) for attempt in await store.list_attempts(rollout_id)}
    others: dict[str | None, AttemptDetail] = {}  # records outside any attempt, or of unregistered attempts
    calls = rewards = 0
    reward_sum: float | None = None  # summed in store order, as the overview does, so both agree exactly
    attempt_calls: dict[str, list[LLMCall]] = {}  # what `classify` needs: every call of each attempt
    records = merge_in_sequence(store.iter_llm_calls(rollout_id), store.iter_rewards(rollout_id))
    async with closing_stream(records) as stream:
        async for record in stream:
            group = known.get(record.attempt_id) if record.attempt_id is not None else None
            if group is None:
                group = others.setdefault(record.attempt_id, AttemptDetail(attempt_id=record.attempt_id))
            group.add(record, limit)
            if isinstance(record, LLMCall):
                calls += 1
                if classify is not None and record.attempt_id is not None:
                    attempt_calls.setdefault(record.attempt_id, []).append(record)
            else:
                rewards += 1
                reward_sum = (reward_sum or 0.0) + record.value
    if rollout is None and not others:
        raise RolloutNotFoundError(rollout_id)
    attempts = ([others.pop(None)] if None in others else []) + list(known.values()) + list(others.values())
    if classify is not None:
        for attempt in attempts:
            labels = classify(attempt_calls.get(attempt.attempt_id or "", []))
            for line in attempt.records:
                if isinstance(line, CallLine) and (label := labels.get((line.sequence, line.choice_index))):
                    line.call_class, line.parent_sequence, line.class_reason = label
    return RolloutDetail(
        rollout_id=rollout_id,
        rollout=None if rollout is None else _row_of(rollout, calls, rewards, reward_sum),
        task=None if rollout is None else rollout.task,
        attempts=attempts,
    )


# --- rendering ------------------------------------------------------------------------------------

_DASH = "–"


def _when(timestamp: float | None) -> str:
    return _DASH if timestamp is None else datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S")


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _number(value: float | None) -> str:
    return _DASH if value is None else repr(value)


def _cell(value: object) -> Text:
    # Text, not str: rich would read "[...]" in ids or model output as markup.
    return Text(_DASH if value is None or value == "" else str(value))


def _one_line(text: str | None) -> Text:
    if text is None:
        return Text(_DASH)
    return Text(text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t"))


def _table() -> Table:
    # No outer edge and shared padding between cells: an 80-column terminal keeps every column.
    # No title either: a table title wraps at the table's own (possibly narrow) width.
    return Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)


def render_overview(overview: StoreOverview) -> RenderableType:
    """The overview as a rich table with a footer line."""
    title = Text(f"rollouts in {overview.store}" if overview.store else "rollouts")
    table = _table()
    table.add_column("rollout", overflow="fold")  # ids have no spaces: fold them in a narrow terminal
    table.add_column("status", no_wrap=True)
    table.add_column("by", no_wrap=True)
    table.add_column("group", overflow="fold")
    for header in ("attempts", "calls", "rewards", "reward sum"):
        table.add_column(header, justify="right")
    table.add_column("created")
    for row in overview.rollouts:
        table.add_row(
            _cell(row.rollout_id),
            _cell(row.status + (" (eval)" if row.eval else "")),
            _cell(row.origin),
            _cell(row.group_id),
            _cell(row.attempts),
            _cell(row.calls),
            _cell(row.rewards),
            _cell(_number(row.reward_sum)),
            _cell(_when(row.created_at)),
        )
    lines = [
        f"{_plural(len(overview.rollouts), 'rollout')} shown; {_plural(overview.calls_without_rollout, 'call')} "
        f"and {_plural(overview.rewards_without_rollout, 'reward')} without a rollout",
        "by: runner = created by our runner; external = registered by its first call, reward or request",
    ]
    if overview.more_rollouts:
        lines.append("more rollouts exist: raise --limit (0 shows all)")
    return Group(title, table, Text("\n".join(lines)))


def _attempt_title(attempt: AttemptDetail) -> str:
    if attempt.attempt_id is None:
        return "records outside any attempt"
    if attempt.number is None:
        return f"attempt {attempt.attempt_id} (not registered in the store)"
    title = f"attempt {attempt.number} {attempt.attempt_id}: {attempt.status}, started {_when(attempt.started_at)}"
    if attempt.error:
        title += f", error: {attempt.error}"
    return title


def _attempt_view(attempt: AttemptDetail) -> RenderableType:
    table = _table()
    # Short headers (explained in the legend) so the response keeps some width in 80 columns.
    table.add_column("seq", justify="right", no_wrap=True)
    table.add_column("record", no_wrap=True)
    table.add_column("class", no_wrap=True)
    table.add_column("model/name", overflow="fold")
    for header in ("in", "out", "finish", "policy", "breaks"):
        table.add_column(header, justify="left" if header == "finish" else "right", no_wrap=True)
    table.add_column("response / value", overflow="fold", min_width=16)
    for line in attempt.records:
        if isinstance(line, CallLine):
            label = "call" if line.call_kind == "token" else "text call"
            if line.choice_index:
                label += f" #{line.choice_index}"
            tokens = line.call_kind == "token"
            table.add_row(
                _cell(line.sequence),
                _cell(label),
                _cell(_class_cell(line)),
                _cell(line.model),
                _cell(line.prompt_tokens if tokens else None),
                _cell(line.response_tokens if tokens else None),
                _cell(line.finish_reason),
                _cell(line.policy_version),
                _cell(line.prefix_breaks),
                _one_line(line.response_preview),
            )
        else:
            blanks = [_cell(None) for _ in range(5)]
            table.add_row(
                _cell(line.sequence),
                _cell("reward"),
                _cell(None),
                _cell(line.name),
                *blanks,
                _cell(_number(line.value)),
            )
    summary = (
        f"{_plural(attempt.calls, 'call')}, {_plural(attempt.rewards, 'reward')}, "
        f"reward sum {_number(attempt.reward_sum)}"
    )
    classes: dict[str, int] = {}
    for line in attempt.records:
        if isinstance(line, CallLine) and line.call_class is not None:
            classes[line.call_class] = classes.get(line.call_class, 0) + 1
    if classes:
        summary += "; classes: " + ", ".join(f"{name} {n}" for name, n in classes.items())
    if attempt.truncated:
        summary += f"; only the first {len(attempt.records)} records are listed: raise --limit (0 shows all)"
    return Group(_one_line(_attempt_title(attempt)), table, Text(summary))


def _class_cell(line: CallLine) -> str | None:
    """`main ←3`: the call's class and, when it has one, its parent call's sequence."""
    if line.call_class is None:
        return None
    return line.call_class if line.parent_sequence is None else f"{line.call_class} ←{line.parent_sequence}"


def render_rollout_detail(detail: RolloutDetail) -> RenderableType:
    """The detail view: a header about the rollout, then one table per attempt."""
    row = detail.rollout
    if row is None:
        header = f"rollout {detail.rollout_id}: not registered in the store (records only)"
    else:
        header = (
            f"rollout {row.rollout_id}: {row.status}{' (eval)' if row.eval else ''}, started by {row.origin}, "
            f"group {row.group_id or _DASH}, "
            f"{_plural(row.attempts, 'attempt')}, {_plural(row.calls, 'call')}, {_plural(row.rewards, 'reward')}, "
            f"reward sum {_number(row.reward_sum)}, "
            f"created {_when(row.created_at)}\ntask: {_preview_json(detail.task)}"
        )
    parts: list[RenderableType] = [Text(header)]
    if not detail.attempts:
        parts.append(Text("no attempts and no records yet"))
    else:
        parts.append(
            Text(f"in/out: prompt/response token counts; policy: policy version; response: first {PREVIEW_CHARS} chars")
        )
    for attempt in detail.attempts:
        parts.extend([Text(""), _attempt_view(attempt)])
    return Group(*parts)


def _preview_json(value: Any, chars: int = 200) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= chars else text[: chars - 1] + "…"
