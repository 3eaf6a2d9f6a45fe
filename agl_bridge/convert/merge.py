"""Multi-turn merge: consecutive calls become one training sequence while each prompt extends the last.

The rule is the Tinker cookbook's: a call continues a segment when its prompt ids start with
that segment's tokens so far (the previous prompt + response) exactly; the prompt's extra tokens
(tool results, user turns, template tokens) are observation tokens with mask 0, and its response
tokens are sampled tokens with mask 1. Otherwise the call starts a new segment holding its whole
prompt (mask 0) and response, and the segment records why (`SplitKind` + a sentence).

Token fidelity: segments are made of the stored prompt and response ids only, never re-tokenized
text, so the merged ids are the ids the sampler consumed and produced. Ids are compared and joined
as int32 arrays (C-level compares and copies); a segment's lists are made once, when it is built.

Beyond the cookbook's strictly consecutive rule:
  - A call may continue any earlier segment of the attempt, not only the last one: the most
    recently continued segment is tried first, then older ones. Two agents taking turns (each
    with its own conversation) thus give one segment per agent, not one per call. The split
    reason of a new segment always compares with the most recent segment.
  - A segment holds one model's samples: a call by another model starts a new segment even when
    its tokens extend (`MODEL_CHANGED`).
  - n > 1 choices of one request (same sequence, choice_index 0..n-1): the first choice goes
    where any call would; each further choice starts its own segment (`CHOICE_BRANCH`) with the
    shared prompt. Later calls continue whichever branch their prompt extends, so when the agent
    carries on with choice 2 it is choice 2's segment that grows.
  - The proxy's `prefix_breaks` records never force a split (the token check decides); when a
    split happens they explain it (`PREFIX_BREAK`).
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from typing import Any

from agl_bridge.convert.graph import RolloutGraph
from agl_bridge.convert.records import SegmentCall, SplitKind, TrajectorySegment
from agl_bridge.types import LLMCall

CallKey = tuple[int, int]


class _Open:
    """A segment being built: its token ids and its calls; masks are laid out once, in `build`."""

    __slots__ = ("calls", "input_ids", "last_sequence", "model", "placed", "reason", "split")

    def __init__(self, call: LLMCall, split: SplitKind | None, reason: str | None) -> None:
        self.model = call.model
        self.split = split
        self.reason = reason
        self.input_ids: array[int] = array("i", call.prompt_token_ids)
        self.calls: list[SegmentCall] = []
        self.placed: list[LLMCall] = []  # the stored calls behind `calls`, for their logprobs and versions
        self.last_sequence = call.sequence

    def extends(self, prompt: array[int]) -> bool:
        """Whether `prompt` is this segment's tokens followed by zero or more tokens."""
        return prompt_extends(prompt, self.input_ids)

    def append(self, call: LLMCall, prompt: array[int], rewards: dict[str, float], graph: RolloutGraph | None) -> None:
        """Add `call`'s observation tokens (its prompt beyond the segment) and its sampled tokens."""
        ids = self.input_ids
        if len(prompt) > len(ids):
            ids.extend(prompt[len(ids) :])
        start = len(ids)
        ids.extend(call.response_token_ids)
        node = None if graph is None else graph.nodes.get((call.sequence, call.choice_index))  # type: ignore[arg-type]
        self.calls.append(
            SegmentCall(
                sequence=call.sequence,  # type: ignore[arg-type]  # checked by convert_attempt
                choice_index=call.choice_index,
                response_start=start,
                response_end=len(ids),
                agent_name=call.agent_name,
                finish_reason=call.finish_reason,
                span_id=call.span_id,
                rewards=rewards,
                call_class=None if node is None else node.call_class,
                parent_sequence=None if node is None or node.parent is None else node.parent[0],
            )
        )
        self.placed.append(call)
        self.last_sequence = call.sequence

    def build(self) -> TrajectorySegment:
        """The finished segment: mask 1, logprobs and versions on each response; 0, 0.0, -1 elsewhere."""
        n = len(self.input_ids)
        loss_mask = [0] * n
        logprobs = [0.0] * n
        versions = [-1] * n
        for spot, call in zip(self.calls, self.placed, strict=False):
            start, end = spot.response_start, spot.response_end
            loss_mask[start:end] = [1] * (end - start)
            logprobs[start:end] = call.response_logprobs
            if call.token_policy_versions:
                versions[start:end] = call.token_policy_versions
            elif call.policy_version is not None:
                versions[start:end] = [call.policy_version] * (end - start)
        return TrajectorySegment(
            input_ids=self.input_ids.tolist(),
            loss_mask=loss_mask,
            sampler_logprobs=logprobs,
            policy_versions=versions,
            model=self.model,
            calls=self.calls,
            split_kind=self.split,
            split_reason=self.reason,
        )


def prompt_extends(prompt: array[int], tokens: array[int]) -> bool:
    """The merge rule: whether `prompt` is `tokens` (a conversation's tokens so far) followed by zero or more
    tokens, so that a call with this prompt continues that conversation."""
    n = len(tokens)
    # The length and last-token checks reject most non-matches without copying a slice.
    return n == 0 or (len(prompt) >= n and prompt[n - 1] == tokens[-1] and prompt[:n] == tokens)


def merge_calls(
    calls: Sequence[LLMCall], rewards_by_call: Mapping[CallKey, dict[str, float]], graph: RolloutGraph | None = None
) -> list[TrajectorySegment]:
    """Merge trainable token calls (in (sequence, choice_index) order) into segments, in creation order.

    `rewards_by_call` gives each call's attributed rewards by (sequence, choice_index); `graph`, the
    attempt's rollout graph, gives each placed call its class and parent.
    """
    if (
        graph is not None
        and graph.one_conversation
        and calls
        and len(calls) == len(graph.nodes)
        and all(call.model == calls[0].model for call in calls)
    ):
        return [_one_segment(calls, rewards_by_call, graph)]
    segments: list[_Open] = []
    # Candidates to continue, least recent first; the segment the last request's first choice
    # went into is kept last so it is tried first (and wins ties against sibling branches).
    recent: list[_Open] = []
    previous_sequence: int | None = None
    for call in calls:
        attributed = rewards_by_call.get((call.sequence, call.choice_index))  # type: ignore[arg-type]
        rewards = {} if attributed is None else dict(attributed)
        prompt = _as_array(call.prompt_token_ids)
        if call.sequence == previous_sequence:
            branch = _Open(
                call,
                SplitKind.CHOICE_BRANCH,
                f"choice {call.choice_index} of the n-choice request at sequence {call.sequence}: only the "
                "first choice continues its conversation in place; each other choice is its own branch",
            )
            branch.append(call, prompt, rewards, graph)
            segments.append(branch)
            recent.insert(len(recent) - 1, branch)
            continue
        previous_sequence = call.sequence
        target = None
        for candidate in reversed(recent):
            if candidate.model == call.model and candidate.extends(prompt):
                target = candidate
                break
        if target is None:
            split, reason = (None, None) if not recent else explain_split(recent[-1], call)
            target = _Open(call, split, reason)
            segments.append(target)
        else:
            recent.remove(target)
        target.append(call, prompt, rewards, graph)
        recent.append(target)
    return [segment.build() for segment in segments]


def _one_segment(
    calls: Sequence[LLMCall], rewards_by_call: Mapping[CallKey, dict[str, float]], graph: RolloutGraph
) -> TrajectorySegment:
    """Every call in one segment: the graph found each prompt extends the one before, so no check is repeated."""
    segment = _Open(calls[0], None, None)
    for call in calls:
        attributed = rewards_by_call.get((call.sequence, call.choice_index))  # type: ignore[arg-type]
        segment.append(call, _as_array(call.prompt_token_ids), {} if attributed is None else dict(attributed), graph)
    return segment.build()


def explain_split(previous: _Open, call: LLMCall) -> tuple[SplitKind, str]:
    """Why `call` does not continue `previous` (the most recently continued segment)."""
    where = f"the call at sequence {call.sequence}"
    if previous.extends(_as_array(call.prompt_token_ids)):
        return SplitKind.MODEL_CHANGED, (
            f"{where} was made by model {call.model!r}, the previous segment by {previous.model!r}; "
            "a segment holds one model's samples"
        )
    ids = previous.input_ids
    prompt = call.prompt_token_ids
    against = f"the previous prompt+response (ending with the call at sequence {previous.last_sequence})"
    differ = next((i for i, (a, b) in enumerate(zip(prompt, ids, strict=False)) if a != b), None)
    if differ is not None:
        detail = (
            f"{where}: prompt does not extend {against} at token {differ} "
            f"(prompt has id {prompt[differ]}, the previous tokens have id {ids[differ]})"
        )
    else:
        detail = (
            f"{where}: prompt ({len(prompt)} tokens) ends before {against} does ({len(ids)} tokens); "
            "it matches up to there"
        )
    if call.prefix_breaks:
        recorded = "; ".join(_describe_break(item) for item in call.prefix_breaks)
        return SplitKind.PREFIX_BREAK, f"{detail}; the proxy recorded: {recorded}"
    return SplitKind.NOT_EXTENDING, detail


def _as_array(ids: Sequence[int]) -> array[int]:
    """Token ids as an int32 array (the store's token-only reads already are: no copy then)."""
    return ids if isinstance(ids, array) else array("i", ids)


def _describe_break(item: Any) -> str:
    if isinstance(item, dict):
        return f"message {item.get('message_index')} {item.get('kind')}: {item.get('reason')}"
    return str(item)
