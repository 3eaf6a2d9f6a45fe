"""Record builders shared by the converter tests (imported as a plain module from tests/convert)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agl_bridge.types import LLMCall, Reward

RID = "ro-1"
AID = "at-1"


def logprobs_for(sequence: int, n: int, choice: int = 0) -> list[float]:
    """Distinct, recognisable logprobs: -(sequence + 1) - choice/10 - i/1000."""
    return [-(sequence + 1) - choice / 10 - i / 1000 for i in range(n)]


def call(
    sequence: int,
    prompt: Sequence[int],
    response: Sequence[int],
    *,
    choice: int = 0,
    model: str = "tiny",
    agent: str | None = None,
    versions: Sequence[int] | None = None,
    policy_version: int | None = None,
    prefix_breaks: list[Any] | None = None,
    rollout_id: str = RID,
    attempt_id: str = AID,
    finish_reason: str = "stop",
) -> LLMCall:
    """A token call; per-token versions default to [sequence + 10] * len(response)."""
    return LLMCall(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        sequence=sequence,
        choice_index=choice,
        model=model,
        agent_name=agent,
        prompt_token_ids=list(prompt),
        response_token_ids=list(response),
        response_logprobs=logprobs_for(sequence, len(response), choice),
        token_policy_versions=list(versions) if versions is not None else [sequence + 10] * len(response),
        policy_version=policy_version,
        prefix_breaks=prefix_breaks or [],
        finish_reason=finish_reason,
        span_id=f"{sequence:08x}{choice:08x}",
    )


def text_call(sequence: int, *, attempt_id: str = AID, model: str = "gpt-remote") -> LLMCall:
    """A text-only call (no token ids)."""
    return LLMCall(
        rollout_id=RID, attempt_id=attempt_id, sequence=sequence, model=model, kind="text", response_text="hi"
    )


def reward(
    sequence: int, value: float, name: str = "reward", *, attempt_id: str | None = AID, rollout_id: str = RID
) -> Reward:
    """A reward at `sequence` (attempt_id None: recorded for the rollout outside any attempt)."""
    return Reward(rollout_id=rollout_id, attempt_id=attempt_id, sequence=sequence, value=value, name=name)


def conversation(
    turns: Sequence[tuple[Sequence[int], Sequence[int]]], *, first_sequence: int = 0, step: int = 1, **kwargs: Any
) -> list[LLMCall]:
    """Calls whose prompts extend exactly: turn k's prompt = turn k-1's prompt + response + observation k.

    `turns` are (observation, response) pairs; the first observation is the first prompt.
    """
    calls: list[LLMCall] = []
    prompt: list[int] = []
    for index, (observation, response) in enumerate(turns):
        prompt = prompt + list(observation)
        calls.append(call(first_sequence + index * step, prompt, response, **kwargs))
        prompt = prompt + list(response)
    return calls
