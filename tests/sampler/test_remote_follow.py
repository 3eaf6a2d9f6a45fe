"""A following remote sampler (a scaled-out run's extra proxy): it names the adapter the trainer loaded into the
servers, so each token's policy version is the one that sampled it, without doing any sync itself.

The servers are `FakeServer`s keeping vLLM's LoRA registry (`lora=True`): `/v1/models` lists the
loaded adapters, and a request naming an unloaded one gets vLLM's 404.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from remote_helpers import FakeServer

from agl_bridge.sampler.affinity import sampling_affinity
from agl_bridge.sampler.base import SamplingParams
from agl_bridge.sampler.remote import RemoteSampler, RemoteSamplerError
from agl_bridge.sampler.remote_protocol import listed_adapters

PARAMS = SamplingParams(max_tokens=3, temperature=1.0)


@pytest.fixture
def servers() -> Iterator[list[FakeServer]]:
    started = [FakeServer(lora=True, model="m") for _ in range(2)]
    try:
        yield started
    finally:
        for server in started:
            server.stop()


def _named(servers: list[FakeServer]) -> list[str]:
    """The model each sampling request named (both servers; sorted, the servers' logs are apart)."""
    return sorted(r["model"] for server in servers for r in server.requests if r["path"] == "/v1/completions")


def test_a_follower_names_the_adapter_the_trainer_loaded_and_stamps_its_version(
    servers: list[FakeServer], tmp_path: Path
) -> None:
    urls = [s.url for s in servers]
    trainer = RemoteSampler(urls, model="m", adapter_dir=tmp_path)
    follower = RemoteSampler(urls, model="m", follow_adapters=True, adapter_refresh_s=3600)
    try:
        assert follower.sample([5, 6], PARAMS).sequences[0].token_policy_versions == [0, 0, 0]
        trainer.load_adapter(tmp_path / "m-v1", 1)
        # A refresh behind: still the base model, and its tokens say so.
        assert follower.sample([5, 6], PARAMS).sequences[0].token_policy_versions == [0, 0, 0]
        assert follower._run_sync(follower.refresh_adapters()) == 1 and follower.active_model == "m-v1"
        assert follower.sample([5, 6], PARAMS).sequences[0].token_policy_versions == [1, 1, 1]

        trainer.load_adapter(tmp_path / "m-v2", 2)  # loads m-v2 everywhere, then unloads m-v1
        assert all("m-v1" not in s.adapters for s in servers)
        before = _named(servers)
        # The follower still names m-v1: the 404 makes it ask again and send the request with m-v2.
        assert follower.sample([5, 6], PARAMS).sequences[0].token_policy_versions == [2, 2, 2]
        assert _named(servers) == sorted([*before, "m-v1", "m-v2"])

        trainer.close()  # unloads every adapter: the follower goes back to the base model
        assert follower.sample([5, 6], PARAMS).sequences[0].token_policy_versions == [0, 0, 0]
        assert follower.active_model == "m"
    finally:
        trainer.close()
        follower.close()


def test_a_follower_loads_unloads_and_deletes_nothing(servers: list[FakeServer], tmp_path: Path) -> None:
    urls = [s.url for s in servers]
    trainer = RemoteSampler(urls, model="m", adapter_dir=tmp_path)
    follower = RemoteSampler(urls, model="m", follow_adapters=True)
    try:
        (tmp_path / "m-v1").mkdir()
        trainer.load_adapter(tmp_path / "m-v1", 1)
        servers[1].adapters.clear()  # that server restarted: the follower loads m-v1 there from the listed folder
        for rollout in range(8):
            with sampling_affinity(f"r{rollout}"):
                assert follower.sample([5, 6], PARAMS).sequences[0].token_policy_versions == [1, 1, 1]
        assert servers[1].adapters == {"m-v1": str((tmp_path / "m-v1").resolve())}
        with pytest.raises(RemoteSamplerError, match="follows the adapters its servers list"):
            follower.load_adapter(tmp_path / "m-v2", 2)
        follower.close()
        assert all("m-v1" in s.adapters for s in servers) and (tmp_path / "m-v1").is_dir(), "the trainer's own"
        assert not [r for s in servers for r in s.requests if r["path"] == "/v1/unload_lora_adapter"]
    finally:
        trainer.close()
        follower.close()


def test_the_listed_adapters_are_the_base_models_versions_only() -> None:
    answer = {
        "data": [
            {"id": "m", "parent": None, "root": "/models/m"},
            {"id": "m-v3", "parent": "m", "root": "/adapters/m-v3"},
            {"id": "m-v12", "parent": "m"},
            {"id": "m-v4", "parent": "other"},
            {"id": "m-vx", "parent": "m", "root": "/x"},
            {"id": "sql-lora", "parent": "m", "root": "/y"},
            "junk",
        ]
    }
    assert listed_adapters(answer, "m") == {"m-v3": (3, "/adapters/m-v3"), "m-v12": (12, "")}
    assert listed_adapters({"data": None}, "m") == {} and listed_adapters([], "m") == {}
