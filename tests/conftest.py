"""Shared pytest fixtures: the offline tiny model (built once per session) and its tokenizer.

The hub switches are set before anything imports transformers or huggingface_hub (they read them
at import time), so no test can reach the network by accident.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _private_agl_bridge_cache(tmp_path_factory: pytest.TempPathFactory):
    """Point AGL_BRIDGE_CACHE at a per-session temp dir so tests never write to the user's cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AGL_BRIDGE_CACHE", str(tmp_path_factory.mktemp("agl_bridge_cache")))
        yield


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory of the default tiny model (hidden 128, 2 layers, vocab 2048, seed 0), built once."""
    from agl_bridge.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_model") / "tiny")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir: Path):
    """The tiny model's tokenizer, loaded with plain AutoTokenizer (a TokenizersBackend)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)
