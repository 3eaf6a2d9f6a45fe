"""Resolution of --model values (tiny, local directories, hub ids) and loading with clear errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from agl_bridge.models import loading
from agl_bridge.models.loading import (
    ModelNotFoundError,
    ensure_tiny_model,
    load_causal_lm,
    load_tokenizer,
    parse_tiny_spec,
    resolve_model_path,
)
from agl_bridge.models.tiny import MARKER_FILENAME, TinyModelSpec

SMALL_TINY = "tiny:hidden=32,layers=1,vocab=600"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private AGL_BRIDGE_CACHE for one test."""
    root = tmp_path / "cache"
    monkeypatch.setenv("AGL_BRIDGE_CACHE", str(root))
    return root


@pytest.fixture
def count_builds(monkeypatch: pytest.MonkeyPatch) -> list[TinyModelSpec]:
    """Records every tiny build that resolution triggers."""
    builds: list[TinyModelSpec] = []
    real_build = loading.build_tiny

    def counting_build(out_dir, spec=None):
        builds.append(spec)
        return real_build(out_dir, spec)

    monkeypatch.setattr(loading, "build_tiny", counting_build)
    return builds


def test_missing_path_error_names_the_path_and_what_was_looked_for(tmp_path: Path) -> None:
    missing = tmp_path / "no_such_model"
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model_path(str(missing))
    message = str(info.value)
    assert str(missing) in message and "config.json" in message and "--model tiny" in message


def test_directory_without_config_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ModelNotFoundError, match="config.json") as info:
        resolve_model_path(str(tmp_path))
    assert str(tmp_path) in str(info.value)


def test_a_file_is_not_a_model(tmp_path: Path) -> None:
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"")
    with pytest.raises(ModelNotFoundError, match="is a file"):
        resolve_model_path(str(weights))


@pytest.mark.parametrize("value", ["", "   ", "just-a-name", "../nowhere/at/all", "/abs/org/name"])
def test_values_that_are_neither_paths_nor_hub_ids_are_rejected(value: str) -> None:
    with pytest.raises(ModelNotFoundError, match="tiny"):
        resolve_model_path(value)


def test_hub_ids_are_returned_as_is() -> None:
    assert resolve_model_path("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"
    assert resolve_model_path("some-org/some.model_v2") == "some-org/some.model_v2"


def test_local_model_directory_resolves_to_its_absolute_path(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = tmp_path / "org" / "name"
    shutil.copytree(tiny_model_dir, local)
    monkeypatch.chdir(tmp_path)
    # An existing directory wins over the hub-id reading of the same string.
    assert resolve_model_path("org/name") == str(local.resolve())
    # A directory called "tiny" needs "./tiny": the bare word means the built-in model.
    monkeypatch.chdir(tiny_model_dir.parent)
    assert resolve_model_path(f"./{tiny_model_dir.name}") == str(tiny_model_dir.resolve())


def test_tiny_is_built_once_into_the_cache_and_then_reused(cache: Path, count_builds: list) -> None:
    first = resolve_model_path(SMALL_TINY)
    second = resolve_model_path(SMALL_TINY)
    assert first == second
    assert len(count_builds) == 1
    spec = TinyModelSpec(hidden=32, layers=1, vocab=600)
    assert Path(first) == cache / "models" / f"tiny-{spec.fingerprint()}"
    assert (Path(first) / MARKER_FILENAME).is_file() and (Path(first) / "config.json").is_file()
    # No staging directories are left behind.
    assert [p.name for p in (cache / "models").iterdir()] == [Path(first).name]


def test_plain_tiny_means_the_default_build(cache: Path, monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path) -> None:
    default = TinyModelSpec()
    target = cache / "models" / f"tiny-{default.fingerprint()}"
    # Pre-seed the cache with the session's default build so this test does not rebuild it.
    shutil.copytree(tiny_model_dir, target)
    monkeypatch.setattr(loading, "build_tiny", lambda *a, **k: pytest.fail("cached build was not reused"))
    assert resolve_model_path("tiny") == str(target)


def test_losing_a_build_race_uses_the_winners_build(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = parse_tiny_spec(SMALL_TINY)
    real_build = loading.build_tiny
    winner = cache / "models" / f"tiny-{spec.fingerprint()}"

    def build_while_another_process_finishes_first(out_dir, spec=None):
        real_build(winner, spec)  # the other process's build lands first
        (winner / "winner.txt").write_text("1")
        return real_build(out_dir, spec)

    monkeypatch.setattr(loading, "build_tiny", build_while_another_process_finishes_first)
    assert ensure_tiny_model(spec) == winner
    assert (winner / "winner.txt").is_file()
    assert [p.name for p in (cache / "models").iterdir()] == [winner.name]


def test_tiny_overrides_are_parsed_and_validated() -> None:
    assert parse_tiny_spec("tiny") == TinyModelSpec()
    assert parse_tiny_spec("tiny:hidden=64, layers=1,seed=3") == TinyModelSpec(hidden=64, layers=1, seed=3)
    assert parse_tiny_spec("tiny:initializer_range=0.1").initializer_range == 0.1
    assert parse_tiny_spec("Qwen/Qwen3-0.6B") is None
    with pytest.raises(ModelNotFoundError, match="one of hidden, layers"):
        parse_tiny_spec("tiny:width=3")
    with pytest.raises(ModelNotFoundError, match="layers must be an integer"):
        parse_tiny_spec("tiny:layers=two")
    with pytest.raises(ModelNotFoundError, match="multiple of 8"):
        parse_tiny_spec("tiny:hidden=30")


def test_unreachable_hub_id_is_a_clear_error() -> None:
    # conftest sets HF_HUB_OFFLINE=1, and the id does not exist anyway: nothing can be fetched.
    for load in (load_tokenizer, load_causal_lm):
        with pytest.raises(ModelNotFoundError) as info:
            load("agl-bridge-test/does-not-exist")
        message = str(info.value)
        assert "'agl-bridge-test/does-not-exist'" in message and "hub" in message and "local directory" in message


def test_load_tokenizer_and_model_from_a_directory(tiny_model_dir: Path) -> None:
    tokenizer = load_tokenizer(str(tiny_model_dir))
    assert len(tokenizer) == 2048 and tokenizer.eos_token == "<|im_end|>"
    model = load_causal_lm(str(tiny_model_dir))
    assert model.dtype == torch.float32 and not model.training
    assert load_causal_lm(str(tiny_model_dir), dtype="bfloat16").dtype == torch.bfloat16
    assert load_causal_lm(str(tiny_model_dir), dtype=torch.float16).dtype == torch.float16


def test_unknown_dtype_name_is_rejected(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="unknown dtype 'float33'"):
        load_causal_lm(str(tiny_model_dir), dtype="float33")


def test_model_directory_without_tokenizer_files(tiny_model_dir: Path, tmp_path: Path) -> None:
    shutil.copy(tiny_model_dir / "config.json", tmp_path / "config.json")
    with pytest.raises(ModelNotFoundError, match="has no tokenizer") as info:
        load_tokenizer(str(tmp_path))
    assert "tokenizer.json" in str(info.value)


def test_a_foreign_directory_in_the_cache_slot_is_reported(cache: Path) -> None:
    spec = parse_tiny_spec(SMALL_TINY)
    slot = cache / "models" / f"tiny-{spec.fingerprint()}"
    slot.mkdir(parents=True)
    with pytest.raises(ModelNotFoundError, match="delete it") as info:
        ensure_tiny_model(spec)
    assert str(slot) in str(info.value)


def test_the_served_model_name_is_tiny_or_the_last_path_part() -> None:
    from agl_bridge.models.loading import served_model_name

    assert served_model_name("tiny") == served_model_name("tiny:hidden=64") == "tiny"
    assert served_model_name("/models/Qwen3-4B/") == served_model_name("Qwen/Qwen3-4B") == "Qwen3-4B"


def test_tiny_family_override() -> None:
    assert parse_tiny_spec("tiny:family=gemma2,hidden=64") == TinyModelSpec(hidden=64, family="gemma2")
    with pytest.raises(ModelNotFoundError, match="family must be one of qwen3, llama"):
        parse_tiny_spec("tiny:family=bert")
