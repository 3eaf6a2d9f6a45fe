"""The records: validation of LLM calls, rewards, rollouts and attempts, and the state machine."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from agl_bridge.types import (
    Attempt,
    AttemptStatus,
    InvalidTransitionError,
    LLMCall,
    Reward,
    Rollout,
    RolloutStatus,
    Usage,
)


def token_call(**overrides: Any) -> LLMCall:
    fields: dict[str, Any] = {
        "model": "tiny",
        "prompt_token_ids": [1, 2],
        "response_token_ids": [3, 4],
        "response_logprobs": [-0.1, -0.2],
    }
    fields.update(overrides)
    return LLMCall(**fields)


# --- rewards ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", [0, 1, -3, 0.5, -1e300, np.float32(0.25), np.int64(2), Fraction(1, 4), Decimal("0.5")]
)
def test_reward_accepts_finite_reals_and_stores_a_float(value: Any) -> None:
    reward = Reward(rollout_id="ro-1", attempt_id="at-1", value=value)
    assert type(reward.value) is float and reward.value == float(value)


@pytest.mark.parametrize(
    "value", [True, False, np.bool_(True), math.nan, math.inf, -math.inf, "1.0", None, Decimal("NaN"), 1j]
)
def test_reward_rejects_anything_but_a_finite_real_and_names_the_value(value: Any) -> None:
    with pytest.raises(ValueError) as info:
        Reward(rollout_id="ro-1", attempt_id="at-1", value=value)
    assert "reward value must be a finite real number" in str(info.value)
    assert repr(value) in str(info.value)


def test_reward_name_and_attribution_are_checked() -> None:
    assert Reward(value=1.0).name == "reward"
    with pytest.raises(ValueError, match="reward name"):
        Reward(value=1.0, name="")
    with pytest.raises(ValueError, match="without a rollout_id"):
        Reward(attempt_id="at-1", value=1.0)
    with pytest.raises(ValueError, match="sequence must be an integer >= 0"):
        Reward(rollout_id="ro-1", value=1.0, sequence=-1)


# --- LLM calls ------------------------------------------------------------------------------------


def test_policy_version_is_the_oldest_token_version_unless_given() -> None:
    assert token_call(token_policy_versions=[5, 4]).policy_version == 4
    assert token_call(token_policy_versions=[5, 4], policy_version=7).policy_version == 7
    assert token_call().policy_version is None
    assert token_call().trainable


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"response_logprobs": [-0.1]}, "each sampled token needs exactly one logprob"),
        ({"token_policy_versions": [1]}, "one version per sampled token"),
        ({"prompt_token_ids": []}, "needs its prompt_token_ids"),
        ({"kind": "tokens"}, "kind must be one of"),
        ({"rollout_id": ""}, "rollout_id must be a non-empty string or None"),
        ({"attempt_id": "at-1"}, "without a rollout_id"),
        ({"rollout_id": "ro-1", "sequence": True}, "sequence must be an integer"),
        ({"choice_index": -1}, "choice_index must be an integer >= 0"),
        ({"model": None}, "model must be a string"),
        ({"policy_version": 1.5}, "policy_version must be an integer"),
        ({"usage": {"input_tokens": 1}}, "usage must be a Usage record"),
    ],
)
def test_malformed_calls_are_rejected(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        token_call(**overrides)


def test_text_calls_carry_no_tokens() -> None:
    call = LLMCall(model="gpt-x", kind="text", response_text="hi")
    assert not call.trainable
    with pytest.raises(ValueError, match="kind='text' call carries no token lists"):
        LLMCall(model="gpt-x", kind="text", prompt_token_ids=[1])


def test_usage_counts_are_non_negative_integers() -> None:
    assert Usage(input_tokens=3, output_tokens=0).input_tokens == 3
    with pytest.raises(ValueError, match="usage.output_tokens"):
        Usage(input_tokens=3, output_tokens=-1)


# --- rollout state machine --------------------------------------------------------------------------

LEGAL = {
    (RolloutStatus.QUEUED, RolloutStatus.RUNNING),
    (RolloutStatus.RUNNING, RolloutStatus.SUCCEEDED),
    (RolloutStatus.RUNNING, RolloutStatus.FAILED),
    (RolloutStatus.RUNNING, RolloutStatus.TIMED_OUT),
    (RolloutStatus.RUNNING, RolloutStatus.QUEUED),
}


@pytest.mark.parametrize("current", list(RolloutStatus))
@pytest.mark.parametrize("new", list(RolloutStatus))
def test_transition_table(current: RolloutStatus, new: RolloutStatus) -> None:
    legal = (current, new) in LEGAL
    assert current.can_transition_to(new) is legal
    if legal:
        current.check_transition(new, "ro-1")
    else:
        with pytest.raises(InvalidTransitionError) as info:
            current.check_transition(new, "ro-1")
        assert f"'ro-1' cannot go from {current.value!r} to {new.value!r}" in str(info.value)


def test_final_statuses() -> None:
    assert {s for s in RolloutStatus if s.is_final} == {
        RolloutStatus.SUCCEEDED,
        RolloutStatus.FAILED,
        RolloutStatus.TIMED_OUT,
    }
    assert {s for s in AttemptStatus if not s.is_final} == {AttemptStatus.RUNNING}


def test_rollout_and_attempt_validation() -> None:
    rollout = Rollout(rollout_id="ro-1", task={"q": 1}, status="running")  # type: ignore[arg-type]
    assert rollout.status is RolloutStatus.RUNNING
    with pytest.raises(ValueError, match="is not a valid RolloutStatus"):
        Rollout(rollout_id="ro-1", task=None, status="done")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rollout_id must be a non-empty string"):
        Rollout(rollout_id="", task=None)
    with pytest.raises(ValueError, match="attempt number must be an integer >= 1"):
        Attempt(rollout_id="ro-1", attempt_id="at-1", number=0)
