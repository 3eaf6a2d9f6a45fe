"""Choosing a remote sampler: `agl-bridge serve --sampler ...` flags and the trainer's config keys,
with errors that name the flag or key."""

from __future__ import annotations

from pathlib import Path

import pytest

from agl_bridge.train.config import ConfigError, config_from_dict


def _serve(*args: str):
    from typer.testing import CliRunner

    from agl_bridge.cli import app

    return CliRunner().invoke(app, ["serve", "--port", "0", *args])


@pytest.mark.slow  # the first in-process `serve` imports LiteLLM (~8 s on 2 cores)
def test_serve_remote_without_a_url_names_the_flag(tmp_path: Path) -> None:
    result = _serve("--sampler", "remote", "--store", str(tmp_path / "s.sqlite"))
    assert result.exit_code == 2 and "--sampler-url" in result.output and "at least one server URL" in result.output


@pytest.mark.slow  # the first in-process `serve` imports LiteLLM (~8 s on 2 cores)
def test_serve_with_an_unknown_sampler_or_a_bad_url_names_the_flag(tmp_path: Path) -> None:
    result = _serve("--sampler", "gpu", "--store", str(tmp_path / "s.sqlite"))
    assert result.exit_code == 2 and "--sampler" in result.output and "hf, remote, vllm" in result.output
    result = _serve("--sampler", "remote", "--sampler-url", "gpu-1:8000", "--store", str(tmp_path / "s.sqlite"))
    assert result.exit_code == 2 and "gpu-1:8000" in result.output


@pytest.mark.slow  # the first in-process `serve` imports LiteLLM (~8 s on 2 cores)
def test_serve_vllm_without_vllm_or_a_gpu_says_what_to_install(tiny_model_dir: Path, tmp_path: Path) -> None:
    result = _serve("--sampler", "vllm", "--model", str(tiny_model_dir), "--store", str(tmp_path / "s.sqlite"))
    assert result.exit_code == 2, result.output
    assert "pip install 'agl-bridge[vllm]'" in result.output
    assert not (tmp_path / "s.sqlite").exists()


def test_trainer_config_keys() -> None:
    config = config_from_dict(
        {"sampler": "remote", "sampler_urls": "http://a:8000, http://b:8000/v1", "adapter_dir": "/shared/adapters"}
    )
    spec = config.sampler_spec()
    assert (
        spec.kind == "remote"
        and spec.urls == ["http://a:8000", "http://b:8000/v1"]
        and spec.adapter_dir == "/shared/adapters"
    )
    assert config_from_dict({"run_dir": "/runs/x"}).sampler_spec().adapter_dir == "/runs/x/adapters"
    with pytest.raises(ConfigError, match="^sampler_urls: "):
        config_from_dict({"sampler": "remote"})
    with pytest.raises(ConfigError, match="^sampler: .*hf, remote, vllm"):
        config_from_dict({"sampler": "tpu"})
    with pytest.raises(ConfigError, match="^sampler_urls: .*only used with sampler 'remote'"):
        config_from_dict({"sampler_urls": ["http://a:1"]})
    with pytest.raises(ConfigError, match="train_unembedding"):
        config_from_dict({"sampler": "remote", "sampler_urls": ["http://a:1"], "train_unembedding": True})
    with pytest.raises(ConfigError, match="sampler_timeout_s"):
        config_from_dict({"sampler": "remote", "sampler_urls": ["http://a:1"], "sampler_timeout_s": 0})


def test_vllm_engine_settings_are_checked_by_name() -> None:
    config = config_from_dict(
        {
            "sampler": "vllm",
            "lora_rank": 128,
            "sampler_dtype": "float32",
            "sampler_max_model_len": 2048,
            "sampler_enforce_eager": True,
        }
    )
    spec = config.sampler_spec()
    assert (spec.dtype, spec.max_model_len, spec.max_lora_rank, spec.max_loras, spec.enforce_eager) == (
        "float32",
        2048,
        128,
        None,
        True,
    ), "max_lora_rank follows a lora_rank above 64"
    assert config_from_dict({"sampler": "vllm"}).sampler_spec().max_lora_rank == 64
    with pytest.raises(ConfigError, match="^sampler_dtype: .*auto, float32, bfloat16, float16"):
        config_from_dict({"sampler": "vllm", "sampler_dtype": "fp8"})
    with pytest.raises(ConfigError, match="^sampler_max_model_len: .*integer >= 2"):
        config_from_dict({"sampler": "vllm", "sampler_max_model_len": 0})
    with pytest.raises(ConfigError, match="sampler_max_lora_rank \\(16\\) must be at least lora_rank \\(32\\)"):
        config_from_dict({"sampler": "vllm", "sampler_max_lora_rank": 16, "lora_rank": 32})
    with pytest.raises(ConfigError, match="^sampler_max_loras: .*set them on the vLLM servers"):
        config_from_dict({"sampler": "remote", "sampler_urls": ["http://a:1"], "sampler_max_loras": 4})
    with pytest.raises(ConfigError, match="^sampler_enforce_eager: .*in-process vLLM engine"):
        config_from_dict({"sampler_enforce_eager": True})


@pytest.mark.slow  # the first in-process `serve` imports LiteLLM (~8 s on 2 cores)
def test_serve_names_the_vllm_flag_that_is_wrong(tmp_path: Path) -> None:
    result = _serve("--sampler", "vllm", "--dtype", "fp8", "--store", str(tmp_path / "s.sqlite"))
    assert result.exit_code == 2 and "--dtype: " in result.output and "fp8" in result.output
    result = _serve("--max-model-len", "512", "--store", str(tmp_path / "s.sqlite"))
    assert result.exit_code == 2 and "--max-model-len: " in result.output and "in-process vLLM" in result.output
