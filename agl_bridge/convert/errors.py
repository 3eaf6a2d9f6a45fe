"""Errors raised while turning stored calls into trajectories; each says what was wrong and what to do."""

from __future__ import annotations


class ConversionError(Exception):
    """Base class of every converter error."""


class MissingRewardError(ConversionError):
    """An attempt that would train has no reward, and the policy is `missing_reward="error"`."""

    def __init__(self, rollout_id: str, attempt_id: str) -> None:
        super().__init__(
            f"rollout {rollout_id!r} attempt {attempt_id!r} succeeded but recorded no reward; make the "
            "agent call emit_reward(...) before it returns, or convert with missing_reward='drop' "
            "(skip such attempts) or 'zero' (train them with a return of 0.0)"
        )
        self.rollout_id = rollout_id
        self.attempt_id = attempt_id


class TrajectoryFormatError(ConversionError, ValueError):
    """A trajectory file (JSON Lines or Parquet) does not hold the documented trajectory schema."""
