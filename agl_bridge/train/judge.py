"""An LLM judge that scores a group's rollouts relative to each other in one call (RULER-style).

ART's RULER showed that a judge ranking the trajectories of one task side by side gives a usable
GRPO reward with no hand-written reward function: only relative scores within a group matter to
GRPO. Here each group (the rollouts of one task in one step) becomes ONE chat call through the
run's own proxy — to a model of its LiteLLM config (recorded as a text-only call) or to the policy
model itself — under the rollout id ``judge-<group>``, which no training step ever converts. The
answer must be JSON, ``{"scores": [s_1, ..., s_n]}`` with n numbers in [0, 1] in the order shown;
anything else is asked again (`JudgeConfig.max_retries` times), then the group is dropped and the
reason counted (`judge_malformed`, `judge_unreachable`): never a silent 0. The scores become the
named reward "judge".
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agl_bridge import semconv
from agl_bridge.convert import Trajectory, group_trajectories
from agl_bridge.errors import ConfigError
from agl_bridge.train.config import JudgeConfig

JUDGE = "judge"
"""The name of the reward the judge's scores become."""

MALFORMED = "judge_malformed"
UNREACHABLE = "judge_unreachable"

SYSTEM_PROMPT = (
    "You are a careful judge. You are shown several attempts at the same task and a rubric. Compare the "
    "attempts with each other and score each from 0 (worst) to 1 (best) by the rubric; better attempts must "
    'score higher. Answer with JSON only, exactly {"scores": [score of attempt 1, score of attempt 2, ...]}, '
    "one number per attempt in the order shown."
)

_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$", re.IGNORECASE)


class JudgeAnswerError(ValueError):
    """The judge's answer is not the JSON scores asked for; the message says what was wrong."""


@dataclass
class Judgement:
    """One group's judgement: its scores (None when dropped), the reason it was dropped, and the calls made."""

    scores: list[float] | None
    dropped_reason: str | None
    calls: int


def parse_scores(text: str, count: int) -> list[float]:
    """The `count` scores in a judge's answer; JudgeAnswerError naming the problem otherwise.

    Accepts ``{"scores": [...]}`` (or a bare list), optionally in a ```json fence, whose items are
    numbers or objects with a "score"; every score must be a finite number in [0, 1].
    """
    body = _FENCE.sub("", text.strip())
    start, end = body.find("{"), body.rfind("}")
    candidate = body[start : end + 1] if 0 <= start < end else body
    try:
        parsed = json.loads(candidate)
    except json.JSONDecodeError as error:
        raise JudgeAnswerError(f"the answer is not JSON ({error.msg})") from None
    items = parsed.get("scores") if isinstance(parsed, dict) else parsed
    if not isinstance(items, list):
        raise JudgeAnswerError('the answer has no "scores" list')
    if len(items) != count:
        raise JudgeAnswerError(f"the answer scores {len(items)} attempts, not {count}")
    scores = []
    for index, item in enumerate(items):
        value = item.get("score") if isinstance(item, dict) else item
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise JudgeAnswerError(f"score {index + 1} is {value!r}, not a number")
        if not 0 <= value <= 1:
            raise JudgeAnswerError(f"score {index + 1} is {value}, outside [0, 1]")
        scores.append(float(value))
    return scores


def judge_messages(rubric: str, task: Any, transcripts: Sequence[str]) -> list[dict[str, str]]:
    """The chat messages of one group's judgement."""
    shown = task if isinstance(task, str) else json.dumps(task, ensure_ascii=False, default=str)
    attempts = "\n\n".join(f"## Attempt {index + 1}\n{text}" for index, text in enumerate(transcripts))
    user = f"# Rubric\n{rubric}\n\n# Task\n{shown}\n\n# Attempts\n{attempts}\n\nScore all {len(transcripts)} attempts."
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def transcript(trajectory: Trajectory, tokenizer: Any, max_chars: int) -> str:
    """What the judge reads of a trajectory: its token sequences as text (special tokens kept), the end kept."""
    text = "\n[...]\n".join(tokenizer.decode(segment.input_ids) for segment in trajectory.segments)
    return text if len(text) <= max_chars else "[...]" + text[-max_chars:]


class GroupJudge:
    """Scores groups through the run's proxy: `check` once before any rollout, then `judge` per group."""

    def __init__(self, config: JudgeConfig, *, base_url: str, api_key: str, tokenizer: Any) -> None:
        from openai import AsyncOpenAI

        self.config = config
        self._tokenizer = tokenizer
        # Retries are ours (a malformed answer is retried too); the client's own would hide failed calls.
        self._client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=300)

    async def check(self) -> None:
        """One short call to the judge; ConfigError naming it when it cannot be reached."""
        try:
            await self._call("judge-check", "a0", [{"role": "user", "content": "Answer with the word OK."}], 4)
        except Exception as error:
            raise ConfigError(
                f"judge.model {self.config.model!r} cannot be reached through the run's proxy: {error}"
            ) from None

    async def judge(self, group_id: str, trajectories: Sequence[Trajectory]) -> Judgement:
        """One call (more only when the answer is malformed or the call fails) scoring the group's trajectories."""
        shown = [transcript(t, self._tokenizer, self.config.max_chars) for t in trajectories]
        messages = judge_messages(self.config.rubric, trajectories[0].task, shown)
        reason = MALFORMED
        for attempt in range(self.config.max_retries + 1):
            try:
                answer = await self._call(f"judge-{group_id}", f"try{attempt}", messages, None)
            except Exception:
                reason = UNREACHABLE
                continue
            try:
                return Judgement(parse_scores(answer, len(trajectories)), None, attempt + 1)
            except JudgeAnswerError:
                reason = MALFORMED
        return Judgement(None, reason, self.config.max_retries + 1)

    async def close(self) -> None:
        """Close the HTTP client."""
        await self._client.close()

    async def _call(
        self, rollout_id: str, attempt_id: str, messages: list[dict[str, str]], max_tokens: int | None
    ) -> str:
        extra: dict[str, Any] = {"max_tokens": max_tokens} if max_tokens is not None else {}
        reply = await self._client.chat.completions.create(
            model=self.config.model,
            messages=messages,  # type: ignore[arg-type]
            temperature=0,
            extra_headers={semconv.HEADER_ROLLOUT_ID: rollout_id, semconv.HEADER_ATTEMPT_ID: attempt_id},
            **extra,
        )
        return reply.choices[0].message.content or ""


@dataclass
class JudgedBatch:
    """A step's trajectories after judging: those of scored groups with their "judge" rewards, and the rest counted."""

    kept: list[Trajectory]
    rewards: list[tuple[Trajectory, dict[str, float]]]
    groups_dropped: dict[str, int]
    calls: int


async def judge_groups(judge: GroupJudge, trajectories: Sequence[Trajectory]) -> JudgedBatch:
    """Judge every group of `trajectories` concurrently, one call per group (more only to retry)."""
    groups = list(group_trajectories(trajectories).items())
    verdicts = await asyncio.gather(*(judge.judge(group_id, members) for group_id, members in groups))
    batch = JudgedBatch([], [], {}, 0)
    for (_, members), verdict in zip(groups, verdicts, strict=True):
        batch.calls += verdict.calls
        if verdict.scores is None:
            reason = verdict.dropped_reason or MALFORMED
            batch.groups_dropped[reason] = batch.groups_dropped.get(reason, 0) + 1
            continue
        batch.kept.extend(members)
        batch.rewards.extend(
            (trajectory, {JUDGE: score}) for trajectory, score in zip(members, verdict.scores, strict=True)
        )
    return batch
