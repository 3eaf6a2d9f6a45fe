"""On-policy distillation pieces: the teacher's logprobs, the per-token advantage, and refusals before any rollout."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from algo_helpers import random_trajectories

from agl_bridge.errors import ConfigError
from agl_bridge.models.loading import load_causal_lm
from agl_bridge.models.tiny import build_tiny_model
from agl_bridge.train.config import config_from_dict
from agl_bridge.train.distill import Teacher, distill_advantages, distill_items
from agl_bridge.train.grpo import GRPOTrainer


def test_teacher_logprobs_are_a_plain_forward_s(tiny_model_dir: Path, tiny_tokenizer) -> None:
    teacher = Teacher(str(tiny_model_dir), policy_tokenizer=tiny_tokenizer, policy_name="tiny", max_batch_tokens=40)
    sequences = [[5, 60, 7, 80, 9, 10, 11], [12, 13], list(range(30, 52))]  # several micro-batches, padding
    model = load_causal_lm(tiny_model_dir)
    for sequence, scored in zip(sequences, teacher.logprobs(sequences), strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([sequence])).logits[0, :-1].float()
        expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(sequence[1:]).unsqueeze(1)).squeeze(1)
        assert scored[0] == 0.0 and len(scored) == len(sequence)
        torch.testing.assert_close(torch.tensor(scored[1:]), expected, rtol=0, atol=1e-5)


def test_the_advantage_is_teacher_minus_student_on_sampled_tokens() -> None:
    trajectory = random_trajectories(0)[0]
    segment = trajectory.segments[0]
    teacher = [-0.5 - 0.1 * i for i in range(len(segment.input_ids))]
    advantages = distill_advantages(segment, teacher)
    for a, t, s, m in zip(advantages, teacher, segment.sampler_logprobs, segment.loss_mask, strict=True):
        assert a == (pytest.approx(t - s) if m else 0.0)


def test_distill_items_score_every_segment_and_report_the_reverse_kl(tiny_model_dir: Path, tiny_tokenizer) -> None:
    teacher = Teacher(str(tiny_model_dir), policy_tokenizer=tiny_tokenizer, policy_name="tiny")
    trajectories = random_trajectories(1)
    items, reverse_kl = distill_items(trajectories, teacher)
    gaps = []
    for (trajectory, per_segment), original in zip(items, trajectories, strict=True):
        assert trajectory is original and len(per_segment) == len(trajectory.segments)
        for segment, advantages in zip(trajectory.segments, per_segment, strict=True):
            gaps += [-a for a, m in zip(advantages, segment.loss_mask, strict=True) if m]
    assert reverse_kl == pytest.approx(sum(gaps) / len(gaps))


def test_a_teacher_with_another_tokenizer_is_refused_naming_both_keys(tmp_path: Path, tiny_tokenizer) -> None:
    other = build_tiny_model(tmp_path / "other", vocab=512, hidden=32)
    with pytest.raises(ConfigError, match=r"teacher '.*other' has another tokenizer than model 'tiny'"):
        Teacher(str(other), policy_tokenizer=tiny_tokenizer, policy_name="tiny")


def test_a_teacher_that_cannot_be_loaded_stops_the_run_before_any_rollout(tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text("def agent(task, endpoint):\n    raise AssertionError('no rollout may run')\n")
    config = config_from_dict(
        {
            "agent": f"{tmp_path / 'agent.py'}:agent",
            "teacher": str(tmp_path / "no-such-teacher"),
            "run_dir": str(tmp_path / "run"),
            "tensorboard": False,
        }
    )
    with pytest.raises(ConfigError, match=r"teacher '.*no-such-teacher' cannot be loaded"):
        GRPOTrainer(config, tasks=["a"]).run()
    assert not (tmp_path / "run" / "store.sqlite").exists()
