"""The algorithms end to end through `agl-bridge train` (subprocesses: a process holds one proxy).

- a judge (a LiteLLM mock model) scores each group in one call; with GSPO, a sequence-level
  rollout correction, RLOO and both shaping penalties in the same run, every piece lands in the
  store and the metrics;
- a judge that answers nonsense drops every group with a counted reason, and trains nothing;
- a judge that cannot be reached stops the run before any rollout;
- on-policy distillation lowers the reverse KL to a teacher through the agent/proxy path.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_grpo_e2e import TASKS, _train_records, _write_run

pytestmark = pytest.mark.slow

QUIET_AGENT = """
def toy_agent(task, endpoint):
    endpoint.openai_client().chat.completions.create(
        model=endpoint.model,
        messages=[{"role": "user", "content": f"Write something about {task}."}],
        max_tokens=8,
    )
"""

JUDGES = """\
model_list:
  - model_name: judge
    litellm_params: {model: openai/judge, api_key: unused, mock_response: '{"scores": [0.1, 0.9]}'}
  - model_name: nonsense-judge
    litellm_params: {model: openai/nonsense, api_key: unused, mock_response: "The second one, clearly."}
  - model_name: absent-judge
    litellm_params: {model: openai/absent, api_key: unused, api_base: "http://127.0.0.1:9/v1"}
"""


def _run(tmp_path: Path, **settings: Any) -> subprocess.CompletedProcess[str]:
    (tmp_path / "judges.yaml").write_text(JUDGES)
    config = _write_run(
        tmp_path,
        QUIET_AGENT,
        litellm_config=str(tmp_path / "judges.yaml"),
        eval_every=100,
        checkpoint_every=100,
        **settings,
    )
    command = [sys.executable, "-m", "agl_bridge.cli", "train", "--config", str(config)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def _rows(tmp_path: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(tmp_path / "run" / "store.sqlite") as db:
        return db.execute(sql).fetchall()


def test_judge_gspo_correction_rloo_and_shaping_in_one_run(tmp_path: Path) -> None:
    result = _run(
        tmp_path,
        steps=2,
        batch_size=3,
        group_size=2,
        judge={"model": "judge", "rubric": "the more useful text wins"},
        loss_fn="gspo",
        rollout_correction="sequence",
        geo_low=0.5,
        advantage="rloo",
        overlong_penalty={"max_tokens": 8, "buffer": 4},
        repetition_penalty={"ngram": 2, "threshold": 0.1},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = _train_records(tmp_path / "run")
    for record in records:
        assert record["judge_calls"] == 3 and record["groups_dropped_by_judge"] == {}, "one call per group"
        assert record["reward_judge_mean"] == pytest.approx(0.5)
        assert -1.0 <= record["reward_overlong_mean"] <= 0 and -1.0 <= record["reward_repetition_mean"] <= 0
        for key in ("sampler_kl_k1", "sampler_kl_k3", "ratio_max", "geo_masked_frac", "tis_capped_frac"):
            assert key in record, key
        assert record["sampler_kl_k3"] >= 0 and record["datums"] == 6
    # In the store: one text-only judge call per group (plus the check before the first rollout), under its own
    # rollout ids, and the trainer's named rewards on every training rollout.
    judge_calls = _rows(tmp_path, "SELECT rollout_key, kind FROM llm_calls WHERE model = 'judge'")
    assert len(judge_calls) == 1 + 2 * 3 and {kind for _, kind in judge_calls} == {"text"}
    assert all(rollout.startswith("judge-") for rollout, _ in judge_calls)
    names = _rows(tmp_path, "SELECT name, COUNT(*) FROM rewards GROUP BY name")
    assert dict(names) == {"judge": 12, "overlong": 12, "repetition": 12}


def test_a_judge_answering_nonsense_drops_every_group_and_trains_nothing(tmp_path: Path) -> None:
    judge = {"model": "nonsense-judge", "rubric": "r", "max_retries": 1}
    result = _run(tmp_path, steps=1, batch_size=3, group_size=2, judge=judge)
    assert result.returncode == 0, result.stderr[-3000:]
    (record,) = _train_records(tmp_path / "run")
    assert record["groups_dropped_by_judge"] == {"judge_malformed": 3} and record["judge_calls"] == 6
    assert record["datums"] == 0 and record["trajectories"] == 0
    assert _rows(tmp_path, "SELECT COUNT(*) FROM rewards WHERE name = 'judge'") == [(0,)], "never a silent 0"


def test_an_unreachable_judge_stops_the_run_before_any_rollout(tmp_path: Path) -> None:
    result = _run(tmp_path, steps=1, judge={"model": "absent-judge", "rubric": "r"})
    assert result.returncode == 2, result.stderr[-3000:]
    assert "judge.model 'absent-judge' cannot be reached" in result.stderr and "Traceback" not in result.stderr
    assert _rows(tmp_path, "SELECT COUNT(*) FROM rollouts") == [(0,)]


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A teacher that says "I'm 42, and I say so." to every prompt: the tiny model after 40 SFT steps, merged."""
    from agl_bridge.chat import ChatCodec
    from agl_bridge.models.loading import load_tokenizer, resolve_model_path
    from agl_bridge.primitives import AdamParams, TrainingClient
    from agl_bridge.train.warm_start import sft_datum

    out = tmp_path_factory.mktemp("teacher") / "teacher42"
    base = resolve_model_path("tiny")
    tokenizer = load_tokenizer(base)
    codec = ChatCodec(tokenizer)
    with TrainingClient(base, lora_rank=16, device="cpu") as client:
        data = [sft_datum(codec, f"Write something about {task}.", "I'm 42, and I say so.") for task in TASKS]
        tokens = sum(sum(d.loss_fn_inputs["weights"]) for d in data)
        for datum in data:
            datum.loss_fn_inputs["weights"] = [w / tokens for w in datum.loss_fn_inputs["weights"]]
        for _ in range(40):
            client.forward_backward(data, "cross_entropy")
            client.optim_step(AdamParams(learning_rate=2e-2))
        client.model.merge_and_unload().save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def test_distillation_lowers_the_reverse_kl_to_the_teacher(tmp_path: Path, teacher_dir: Path) -> None:
    # A short cold start (two SFT steps toward the teacher's answer) so the student ever samples what the teacher
    # likes; then on-policy distillation alone, with no reward from the agent.
    (tmp_path / "sft.jsonl").write_text(
        "".join(
            json.dumps({"prompt": f"Write something about {t}.", "response": "I'm 42, and I say so."}) + "\n"
            for t in TASKS
        )
    )
    result = _run(
        tmp_path,
        teacher=str(teacher_dir),
        steps=20,
        batch_size=8,
        group_size=2,
        learning_rate=5e-3,
        # 12 steps at a constant rate failed about one run in eight (a late jump back up, or a plateau): the
        # drop was -1.2 to 2.5 nats. 20 steps decaying to zero: 1.6-5.1 in the runs measured.
        lr_schedule="linear",
        default_max_tokens=12,
        warm_start={"data": str(tmp_path / "sft.jsonl"), "steps": 2, "batch_size": 8, "learning_rate": 1e-2},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = _train_records(tmp_path / "run")
    kl = [r["reverse_kl"] for r in records]
    assert all(r["datums"] == 16 and r["dropped"] == 0 for r in records), "no reward needed"
    assert sum(kl[-3:]) / 3 < sum(kl[:3]) / 3 - 0.8, kl
