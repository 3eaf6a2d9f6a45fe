"""The copy pre-training's plumbing: a loadable model directory, cached by base and settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agl_bridge.models.copying import MARKER_FILENAME, CopyPretraining, pretrain_copying
from agl_bridge.models.loading import load_causal_lm, load_tokenizer, resolve_model_path

SHORT = CopyPretraining(steps=2, batch_size=2, length=8)


def test_a_pretrained_copy_is_an_ordinary_model_directory_cached_by_its_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGL_BRIDGE_CACHE", str(tmp_path / "cache"))
    base = resolve_model_path("tiny")
    path = pretrain_copying("tiny", SHORT)
    marker = json.loads((path / MARKER_FILENAME).read_text())
    assert marker["steps"] == 2 and marker["base"] == base and marker["repeat_loss"] > 0
    assert not (path / "agl_bridge_tiny.json").exists(), "not mistaken for an untrained tiny build"
    assert load_tokenizer(str(path)).get_vocab() == load_tokenizer(base).get_vocab()
    trained = load_causal_lm(str(path)).state_dict()
    untrained = load_causal_lm(base).state_dict()
    assert any(not trained[name].equal(untrained[name]) for name in untrained), "the weights were trained"

    written = (path / "model.safetensors").stat().st_mtime_ns
    assert pretrain_copying("tiny", SHORT) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == written, "the second call reads the cache"
    assert pretrain_copying("tiny", CopyPretraining(steps=3, batch_size=2, length=8)) != path
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")], "no staging folder left behind"
