"""GRPO loop parts: config loading, advantages, datums."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agl_bridge.convert import SegmentCall, Trajectory, TrajectorySegment
from agl_bridge.train.advantages import group_advantages
from agl_bridge.train.config import ConfigError, config_from_dict, load_config
from agl_bridge.train.datums import datums_for


def test_config_files_in_three_formats(tmp_path: Path) -> None:
    (tmp_path / "tasks.jsonl").write_text("1\n")
    (tmp_path / "run.toml").write_text('agent = "a.py:f"\ntasks = "tasks.jsonl"\nsteps = 3\n[warm_start]\nsteps = 5\n')
    (tmp_path / "run.yaml").write_text("agent: a.py:f\ntasks: tasks.jsonl\nsteps: 3\n")
    (tmp_path / "run.json").write_text(json.dumps({"agent": "a.py:f", "tasks": "tasks.jsonl", "steps": 3}))
    for name in ("run.toml", "run.yaml", "run.json"):
        config = load_config(tmp_path / name)
        assert config.steps == 3 and config.tasks == str(tmp_path / "tasks.jsonl")
    assert load_config(tmp_path / "run.toml").warm_start.steps == 5


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"stepz": 3}, "unknown key 'stepz'"),
        ({"warm_start": {"stepz": 1}}, "unknown key 'warm_start.stepz'"),
        ({"batch_size": 0}, "batch_size must be an integer >= 1"),
        ({"final_eval_group_size": 0}, "final_eval_group_size must be an integer >= 1"),
        ({"loss_fn": "dpo"}, "loss_fn must be one of"),
        ({"tis_cap": 0.5}, "tis_cap must be >= 1"),
        ({"clip_high_threshold": 0.2}, "clip thresholds are ratios"),
        ({"learning_rate": 0}, "learning_rate must be > 0"),
    ],
)
def test_config_errors_name_the_key(raw: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_dict(raw)


def test_unreadable_config_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the config"):
        load_config(tmp_path / "missing.toml")
    (tmp_path / "bad.toml").write_text("steps = = 3")
    with pytest.raises(ConfigError, match="does not parse"):
        load_config(tmp_path / "bad.toml")


def test_a_litellm_config_is_resolved_next_to_the_run_config_and_checked(tmp_path: Path) -> None:
    (tmp_path / "judges.yaml").write_text(
        "model_list:\n  - model_name: judge\n    litellm_params: {model: openai/judge}\n"
    )
    (tmp_path / "run.toml").write_text('agent = "a.py:f"\ntasks = "t.jsonl"\nlitellm_config = "judges.yaml"\n')
    assert load_config(tmp_path / "run.toml").litellm_config == str(tmp_path / "judges.yaml")
    (tmp_path / "broken.yaml").write_text("model_list: 3\n")
    with pytest.raises(ConfigError, match="litellm_config: model_list in .* must be a list"):
        config_from_dict({"litellm_config": str(tmp_path / "broken.yaml")})
    with pytest.raises(ConfigError, match="litellm_config: cannot read the LiteLLM config"):
        config_from_dict({"litellm_config": str(tmp_path / "missing.yaml")})


def _trajectory(rollout: str, group: str, reward: float, tokens: int = 6) -> Trajectory:
    segment = TrajectorySegment(
        input_ids=list(range(tokens)),
        loss_mask=[0, 0, 0] + [1] * (tokens - 3),
        sampler_logprobs=[0.0, 0.0, 0.0] + [-1.0] * (tokens - 3),
        policy_versions=[-1, -1, -1] + [0] * (tokens - 3),
        model="tiny",
        calls=[SegmentCall(sequence=0, choice_index=0, response_start=3, response_end=tokens)],
    )
    return Trajectory(rollout_id=rollout, attempt_id="at-" + rollout, group_id=group, reward=reward, segments=[segment])


def test_advantages_are_centred_per_group_and_flat_groups_dropped() -> None:
    batch = group_advantages(
        [
            _trajectory("r1", "g1", 1.0),
            _trajectory("r2", "g1", 0.0),
            _trajectory("r3", "g2", 0.5),
            _trajectory("r4", "g2", 0.5),
        ]
    )
    assert batch.groups == 2 and batch.groups_dropped_zero_variance == 1
    assert {t.rollout_id: a for t, a in batch.items} == {"r1": 0.5, "r2": -0.5}
    scaled = group_advantages([_trajectory("r1", "g1", 1.0), _trajectory("r2", "g1", 0.0)], std_scaling=True)
    assert [round(a, 4) for _, a in scaled.items] == [1.0, -1.0]


@pytest.mark.parametrize(
    ("aggregation", "scale"), [("token_sum", 1.0), ("token_mean", 1 / 5), ("sequence_mean", 1 / 10)]
)
def test_datums_carry_scaled_advantages_on_sampled_tokens_only(aggregation: str, scale: float) -> None:
    items = [(_trajectory("r1", "g", 1.0, tokens=6), 0.5), (_trajectory("r2", "g", 0.0, tokens=5), -0.5)]
    datums = datums_for(items, aggregation)
    assert [d.model_input for d in datums] == [[0, 1, 2, 3, 4], [0, 1, 2, 3]]
    first = datums[0].loss_fn_inputs
    assert first["target_tokens"] == [1, 2, 3, 4, 5]
    assert first["weights"] == [0, 0, 1, 1, 1]
    expected = 0.5 * (scale if aggregation != "sequence_mean" else 1 / (3 * 2))
    assert first["advantages"] == pytest.approx([0, 0, expected, expected, expected])
    assert first["logprobs"][2:] == [-1.0, -1.0, -1.0]


def test_the_removed_micro_batch_size_is_refused_naming_its_replacement() -> None:
    with pytest.raises(ConfigError, match="micro_batch_size was removed; use max_batch_tokens"):
        config_from_dict({"micro_batch_size": 8})
    assert config_from_dict({"max_batch_tokens": 4096}).max_batch_tokens == 4096
    with pytest.raises(ConfigError, match="max_batch_tokens must be an integer >= 1"):
        config_from_dict({"max_batch_tokens": 0})


REMOTE = {"sampler": "remote", "sampler_urls": ["http://127.0.0.1:8000"]}
PG = "postgresql://agl@127.0.0.1:5432/runs"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({**REMOTE, "proxy_urls": ["http://127.0.0.1:4001"], "proxy_api_key": "k"}, 'needs store = "postgresql://'),
        (
            {"store": PG, "proxy_urls": ["http://127.0.0.1:4001"], "proxy_api_key": "k"},
            "needs sampler = \"remote\" \\(got 'hf'\\)",
        ),
        ({**REMOTE, "store": PG, "proxy_urls": ["http://127.0.0.1:4001"]}, "needs proxy_api_key"),
        ({**REMOTE, "store": PG, "proxy_urls": ["127.0.0.1:4001"], "proxy_api_key": "k"}, "not a proxy's root URL"),
        (
            {**REMOTE, "store": PG, "proxy_urls": ["http://a:1", "http://a:1/v1"], "proxy_api_key": "k"},
            "proxy_urls must differ",
        ),
        (
            {**REMOTE, "mode": "follow", "proxy_urls": ["http://a:1"], "proxy_api_key": "k"},
            "proxy_urls is a setting of an online run.*harness picks the proxies",
        ),
    ],
)
def test_extra_proxies_need_a_shared_store_a_remote_sampler_and_their_key(
    raw: dict, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGL_PROXY_API_KEY", raising=False)
    with pytest.raises(ConfigError, match=message) as refused:
        config_from_dict(raw)
    assert "proxy_urls" in str(refused.value)


def test_extra_proxies_take_their_key_from_the_config_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = {**REMOTE, "store": PG, "proxy_urls": ["http://10.0.0.5:4000/v1", "http://10.0.0.6:4000/"]}
    monkeypatch.setenv("AGL_PROXY_API_KEY", "from-env")
    proxies = config_from_dict(raw).extra_proxies()
    assert [(p.url, p.api_key) for p in proxies] == [
        ("http://10.0.0.5:4000", "from-env"),
        ("http://10.0.0.6:4000", "from-env"),
    ]
    assert {p.api_key for p in config_from_dict({**raw, "proxy_api_key": "own"}).extra_proxies()} == {"own"}
    assert "from-env" not in repr(proxies)
