"""A rollout's step and evaluation, read from the group id the GRPO loop gave it."""

from __future__ import annotations

import pytest

from agl_bridge.viewer.steps import EVAL, TRAIN, StepRef, evaluation_of, step_of


@pytest.mark.parametrize(
    ("group_id", "step", "evaluation"),
    [
        ("s3-1", StepRef(TRAIN, 4, 1), None),
        ("eval4-81234567-0", StepRef(EVAL, 4, 0), "eval4-81234567"),
        ("eval0-12-7", StepRef(EVAL, 0, 7), "eval0-12"),
        ("my-group", None, None),
        ("eval-1", None, None),
        (None, None, None),
    ],
)
def test_the_step_and_the_evaluation_of_a_group(
    group_id: str | None, step: StepRef | None, evaluation: str | None
) -> None:
    assert step_of(group_id) == step
    assert evaluation_of(group_id) == evaluation


def test_two_evaluations_of_one_step_are_told_apart_by_their_stamp() -> None:
    assert evaluation_of("eval0-111-3") != evaluation_of("eval0-222-3")
