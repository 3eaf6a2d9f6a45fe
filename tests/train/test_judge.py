"""The judge: its answers parsed strictly, retried, and a group it cannot score dropped with a counted reason."""

from __future__ import annotations

from typing import Any

import pytest
from algo_helpers import random_trajectories

from agl_bridge.errors import ConfigError
from agl_bridge.train.config import JudgeConfig
from agl_bridge.train.judge import (
    JUDGE,
    MALFORMED,
    UNREACHABLE,
    GroupJudge,
    JudgeAnswerError,
    judge_groups,
    judge_messages,
    parse_scores,
)


@pytest.mark.parametrize(
    "text",
    [
        '{"scores": [0.1, 1, 0.5]}',
        '```json\n{"scores": [0.1, 1, 0.5]}\n```',
        'Here you go: {"scores": [{"score": 0.1}, {"score": 1}, {"score": 0.5}]} done',
        "[0.1, 1, 0.5]",
    ],
)
def test_well_formed_answers(text: str) -> None:
    assert parse_scores(text, 3) == [0.1, 1.0, 0.5]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("I like the second one", "not JSON"),
        ('{"ranking": [1, 2, 3]}', 'no "scores"'),
        ('{"scores": [0.1, 0.2]}', "scores 2 attempts, not 3"),
        ('{"scores": [0.1, "high", 0.2]}', "score 2 is 'high'"),
        ('{"scores": [0.1, 1.5, 0.2]}', "outside"),
        ('{"scores": [0.1, true, 0.2]}', "not a number"),
        ('{"scores": [0.1, NaN, 0.2]}', "not a number"),
    ],
)
def test_malformed_answers_say_what_is_wrong(text: str, problem: str) -> None:
    with pytest.raises(JudgeAnswerError, match=problem):
        parse_scores(text, 3)


def test_the_prompt_shows_rubric_task_and_every_attempt() -> None:
    messages = judge_messages("be short", {"q": "hi"}, ["one", "two"])
    user = messages[1]["content"]
    assert "be short" in user and '"q": "hi"' in user and "## Attempt 1\none" in user and "## Attempt 2\ntwo" in user


class ScriptedJudge(GroupJudge):
    """A GroupJudge whose calls return scripted answers (an exception object raises) and are logged."""

    def __init__(self, answers: list[Any], max_retries: int = 2) -> None:
        config = JudgeConfig(model="judge", rubric="r", max_retries=max_retries)
        super().__init__(config, base_url="http://127.0.0.1:9/v1", api_key="k", tokenizer=_Decoder())
        self.answers = list(answers)
        self.calls: list[tuple[str, str]] = []

    async def _call(self, rollout_id: str, attempt_id: str, messages: Any, max_tokens: int | None) -> str:
        self.calls.append((rollout_id, attempt_id))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


class _Decoder:
    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))


async def test_a_malformed_answer_is_retried_then_accepted() -> None:
    trajectories = random_trajectories(0, groups=1, sizes=(3,))
    judge = ScriptedJudge(["nonsense", '{"scores": [0.2, 0.9, 0.4]}'])
    verdict = await judge.judge("g0", trajectories)
    assert verdict.scores == [0.2, 0.9, 0.4] and verdict.calls == 2 and verdict.dropped_reason is None
    assert judge.calls == [("judge-g0", "try0"), ("judge-g0", "try1")]


@pytest.mark.parametrize(("answer", "reason"), [("nonsense", MALFORMED), (RuntimeError("down"), UNREACHABLE)])
async def test_a_group_the_judge_cannot_score_is_dropped_with_its_reason(answer: Any, reason: str) -> None:
    judge = ScriptedJudge([answer], max_retries=1)
    verdict = await judge.judge("g0", random_trajectories(0, groups=1, sizes=(2,)))
    assert verdict.scores is None and verdict.dropped_reason == reason and verdict.calls == 2


async def test_one_call_per_group_and_scores_become_the_judge_reward() -> None:
    trajectories = random_trajectories(2, groups=4, sizes=(2, 2, 2, 2))
    judge = ScriptedJudge(['{"scores": [0.25, 0.75]}'])
    batch = await judge_groups(judge, trajectories)
    assert batch.calls == 4 and len(judge.calls) == 4 and len({rid for rid, _ in judge.calls}) == 4
    assert len(batch.kept) == 8 and batch.groups_dropped == {}
    assert sorted(r[JUDGE] for _, r in batch.rewards) == [0.25] * 4 + [0.75] * 4


async def test_malformed_groups_are_counted_not_zeroed() -> None:
    trajectories = random_trajectories(2, groups=2, sizes=(2, 3))
    judge = ScriptedJudge(['{"scores": [0.25, 0.75]}'], max_retries=0)  # right for the pair, wrong for the trio
    batch = await judge_groups(judge, trajectories)
    assert batch.groups_dropped == {MALFORMED: 1} and len(batch.kept) == 2 and batch.calls == 2
    assert all(JUDGE in rewards for _, rewards in batch.rewards)


async def test_an_unreachable_judge_is_a_config_error_naming_it() -> None:
    judge = ScriptedJudge([ConnectionError("refused")])
    with pytest.raises(ConfigError, match="judge.model 'judge' cannot be reached"):
        await judge.check()
