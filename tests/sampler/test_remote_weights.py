"""Weight sync to a remote server: the trainer writes each adapter where the server reads it, the server
loads it as `<model>-v<N>`, requests name it, tokens report version N, and the previous one is unloaded.

The server is a real `agl-bridge serve` subprocess of this module's own (a sync changes its weights).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from remote_helpers import KEY, perturb_lora, serving, trainer_logprobs

from agl_bridge.sampler.base import SamplingParams
from agl_bridge.sampler.remote import RemoteSampler

PROMPT = [5, 17, 300, 42, 7, 99]
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, stop=[])

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sync_target(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    with serving(tiny_model_dir, tmp_path_factory.mktemp("sync_target") / "target.sqlite") as server:
        yield server


def _post(url: str, path: str, body: dict, key: str | None = KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{url}{path}", json=body, headers=headers, timeout=60)


def test_sync_loads_each_version_by_name_and_unloads_the_old(sync_target, tiny_model_dir: Path, tmp_path: Path) -> None:
    from agl_bridge.primitives.client import TrainingClient

    adapters = tmp_path / "adapters"
    remote = RemoteSampler([sync_target.url], model="tiny", api_key=KEY, adapter_dir=adapters, max_context=4096)
    client = TrainingClient(str(tiny_model_dir), lora_rank=4, sampler=remote)
    try:
        base = remote.sample(PROMPT, GREEDY).sequences[0]
        perturb_lora(client, 1)
        sampling = client.save_weights_and_get_sampling_client()
        assert sampling.weights_version == 1 and remote.policy_version == 1 and remote.active_model == "tiny-v1"
        assert (adapters / "tiny-v1" / "adapter_config.json").is_file()
        first = remote.sample(PROMPT, GREEDY).sequences[0]
        assert first.token_policy_versions == [1] * 6
        assert first.logprobs != base.logprobs, "the server samples with the new adapter"
        trainer = trainer_logprobs(client, PROMPT + first.tokens)[len(PROMPT) - 1 :]
        assert first.logprobs == pytest.approx(trainer, abs=1e-4), "server and trainer score the same weights"

        perturb_lora(client, 2)
        client.save_weights_and_get_sampling_client()
        second = remote.sample(PROMPT, GREEDY).sequences[0]
        assert remote.active_model == "tiny-v2" and second.token_policy_versions == [2] * 6
        assert not (adapters / "tiny-v1").exists() and (adapters / "tiny-v2").is_dir()
        old = _post(sync_target.url, "/v1/completions", {"model": "tiny-v1", "prompt": PROMPT, "max_tokens": 2})
        assert old.status_code == 404 and "tiny-v1" in old.json()["error"]["message"]
        current = _post(
            sync_target.url,
            "/v1/completions",
            {"model": "tiny-v2", "prompt": PROMPT, "max_tokens": 2, "return_token_ids": True},
        )
        assert current.status_code == 200 and current.json()["choices"][0]["token_policy_versions"] == [2, 2]
    finally:
        client.close()
        remote.close()


def test_the_lora_routes_answer_like_vllm(sync_target, tmp_path: Path) -> None:
    missing = _post(sync_target.url, "/v1/load_lora_adapter", {"lora_name": "x-v9", "lora_path": str(tmp_path)})
    assert missing.status_code == 400 and "adapter_config.json" in missing.json()["error"]["message"]
    assert missing.json()["error"]["param"] == "lora_path"
    unknown = _post(sync_target.url, "/v1/unload_lora_adapter", {"lora_name": "never-loaded"})
    assert (
        unknown.status_code == 404
        and unknown.json()["error"]["message"] == "The lora adapter 'never-loaded' cannot be found."
    )
    no_name = _post(sync_target.url, "/v1/load_lora_adapter", {"lora_path": "/x"})
    assert no_name.status_code == 400 and no_name.json()["error"]["param"] == "lora_name"
    assert (
        _post(sync_target.url, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "/x"}, key=None).status_code
        == 401
    )
