"""The sampler's cache is built from the model's config: sliding-window layers hold only their window,
full-attention layers every column, across prefill, decode, joins and departures."""

from __future__ import annotations

from pathlib import Path

import pytest

from agl_bridge.models.families import SLIDING_WINDOW
from agl_bridge.models.loading import load_causal_lm
from agl_bridge.models.tiny import build_tiny_model
from agl_bridge.sampler.base import SamplingParams, TokenEvent
from agl_bridge.sampler.hf import HFSampler


@pytest.fixture(scope="module")
def gemma2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Gemma 2: layer 0 slides over an 8-token window, layer 1 attends to everything."""
    return build_tiny_model(tmp_path_factory.mktemp("kv") / "gemma2", hidden=64, vocab=512, family="gemma2")


def test_sliding_layers_keep_only_their_window(gemma2_dir: Path) -> None:
    with HFSampler(load_causal_lm(gemma2_dir)) as sampler:
        assert sampler._layout.windows == (SLIDING_WINDOW, None)
        held: list[tuple[int, list[int]]] = []

        def measure(_event: TokenEvent) -> None:  # runs on the worker thread, right after a step
            kv = sampler._kv
            if kv is not None:
                held.append((kv.columns, [layer.keys.shape[-2] for layer in kv.cache.layers]))

        short = sampler.submit([5, 6, 7], SamplingParams(max_tokens=4, stop=[]))
        sampler.submit(list(range(10, 30)), SamplingParams(max_tokens=30, stop=[]), on_token=measure).result(60)
        short.result(60)
    assert len(held) == 30
    for columns, (sliding, full) in held:
        assert full == columns
        assert sliding == min(columns, SLIDING_WINDOW - 1)
    assert held[-1] == (20 + 29, [SLIDING_WINDOW - 1, 20 + 29])
