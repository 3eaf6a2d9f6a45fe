"""A rollout attempt's timeline: its LLM calls, rewards and agent-framework spans in store sequence order.

Calls, rewards and spans share one sequence space per (rollout, attempt), allocated by the store as
they arrived, so this order is the order things happened in (clocks are never compared). Pages
are keyset ranges of sequences: `after` is the last sequence of the previous page, and a page
always holds every choice of its last call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agl_bridge.types import LLMCall, Reward, StoredSpan
from agl_bridge.viewer.chat import ChatMessage, chat_message, new_messages, response_message
from agl_bridge.viewer.records import Reader, calls_after, previous_call_messages, rewards_after, spans_after

PAGE_ITEMS = 50

CALL, REWARD, SPAN = "call", "reward", "span"


@dataclass(slots=True)
class CallView:
    """One LLM call: its new messages (those the previous call did not have), its response, its timing."""

    call: LLMCall
    earlier_messages: int
    messages: list[ChatMessage]
    response: ChatMessage

    @property
    def latency_ms(self) -> float | None:
        """Time from request to recorded response."""
        call = self.call
        if call.started_at is None or call.ended_at is None:
            return None
        return (call.ended_at - call.started_at) * 1000


@dataclass(slots=True)
class SpanView:
    """One agent-framework span, with its attributes as indented JSON."""

    span: StoredSpan
    attributes: str

    @property
    def duration_ms(self) -> float:
        """The span's own duration."""
        return (self.span.end_time_ns - self.span.start_time_ns) / 1e6


@dataclass(slots=True)
class TimelineItem:
    """One entry: exactly one of call, reward or span is set."""

    kind: str
    sequence: int
    call: CallView | None = None
    reward: Reward | None = None
    span: SpanView | None = None


@dataclass(slots=True)
class TimelinePage:
    """A page of one attempt's timeline; `next_after` is None on the last page."""

    items: list[TimelineItem] = field(default_factory=list)
    after: int = -1
    next_after: int | None = None


def timeline_page(
    conn: Reader, rollout_id: str, attempt_id: str | None, after: int = -1, size: int = PAGE_ITEMS
) -> TimelinePage:
    """The records of one attempt (None: the rollout's records outside any attempt) after sequence `after`."""
    calls = calls_after(conn, rollout_id, attempt_id, after, size + 1)
    rewards = rewards_after(conn, rollout_id, attempt_id, after, size + 1)
    spans = spans_after(conn, rollout_id, attempt_id, after, size + 1)
    entries: list[tuple[int, int, Any]] = [(c.sequence or 0, 0, c) for c in calls]
    entries += [(r.sequence or 0, 1, r) for r in rewards]
    entries += [(s.sequence or 0, 2, s) for s in spans]
    entries.sort(key=lambda entry: (entry[0], entry[1], getattr(entry[2], "choice_index", 0)))
    page = TimelinePage(after=after)
    more = len(entries) > size
    if more:
        last = entries[size - 1][0]
        entries = [entry for entry in entries if entry[0] <= last]
        # A call whose choices run past the fetched rows would be cut: end the page before it instead.
        if len(calls) > size and calls[-1].sequence == last:
            entries = [entry for entry in entries if entry[0] < last] or entries
        page.next_after = entries[-1][0]
    previous = previous_call_messages(conn, rollout_id, attempt_id, after) if after >= 0 else None
    for sequence, _, record in entries:
        if isinstance(record, LLMCall):
            shared, fresh = new_messages(previous, record.messages)
            previous = record.messages
            view = CallView(record, shared, [chat_message(m) for m in fresh], response_message(record.response_text))
            page.items.append(TimelineItem(CALL, sequence, call=view))
        elif isinstance(record, Reward):
            page.items.append(TimelineItem(REWARD, sequence, reward=record))
        else:
            attributes = json.dumps(record.attributes, indent=2, ensure_ascii=False, sort_keys=True)
            page.items.append(TimelineItem(SPAN, sequence, span=SpanView(record, attributes)))
    return page
