"""Fixtures for sampler tests: a sampler over the tiny model, one per test module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from agl_bridge.sampler.hf import HFSampler


@pytest.fixture(scope="module")
def sampler(tiny_model_dir: Path, tiny_tokenizer) -> Iterator[HFSampler]:
    """A sampler over a fresh copy of the tiny model (tests that swap weights get their own)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with HFSampler(model, tiny_tokenizer, seed=0) as sampler:
        yield sampler


@pytest.fixture(scope="session")
def remote_target(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """A real `agl-bridge serve` on the tiny model in a subprocess: the server remote-sampler tests call."""
    from remote_helpers import serving

    with serving(tiny_model_dir, tmp_path_factory.mktemp("remote_target") / "target.sqlite") as server:
        yield server
