"""Fixtures of the architecture conformance suite: one tiny random model per family users bring.

Every family is built offline from transformers' own config class (hidden 64, 2 layers, vocab 512;
`agl_bridge.models.families`), with the shared byte-level BPE tokenizer and ChatML template. The
suite records what it measured per family and prints the table at the end of the run.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agl_bridge.models.families import FAMILIES

TINY = {"hidden": 64, "layers": 2, "vocab": 512}
"""Build arguments of every family's model: small enough that the whole suite runs in well under 5 minutes."""

_results: dict[str, dict[str, Any]] = {}


@pytest.fixture(scope="session", params=list(FAMILIES))
def family(request: pytest.FixtureRequest) -> str:
    """Each architecture family in turn."""
    return str(request.param)


@pytest.fixture(scope="session")
def family_dir(family: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model directory of `family` (config, weights, tokenizer, chat template)."""
    from agl_bridge.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp(f"conformance-{family}") / family, family=family, **TINY)


@pytest.fixture(scope="session")
def family_tokenizer(family_dir: Path) -> Any:
    """The tokenizer of the family's model directory."""
    from agl_bridge.models.loading import load_tokenizer

    return load_tokenizer(family_dir)


@pytest.fixture
def results(family: str) -> Iterator[dict[str, Any]]:
    """Where a test records its figures for `family`; printed as one table row per family at the end."""
    yield _results.setdefault(family, {})


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The per-family conformance table (only when the suite ran)."""
    if not _results:
        return
    columns = ("greedy == generate", "logprob gap max", "LoRA swap gap max", "GRPO step")
    terminalreporter.write_sep("-", "architecture conformance (tiny random models, fp32, CPU)")
    terminalreporter.write_line(f"{'family':<10} " + " | ".join(f"{c:>18}" for c in columns))
    for family in FAMILIES:
        row = _results.get(family)
        if row is not None:
            cells = [_cell(row.get(column)) for column in columns]
            terminalreporter.write_line(f"{family:<10} " + " | ".join(f"{c:>18}" for c in cells))


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1e}"
    return str(value)
