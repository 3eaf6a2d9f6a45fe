"""`agl_bridge.export`: every `--what` has its exporter, and each refuses what is not its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from agl_bridge.convert import ConvertOptions
from agl_bridge.export import EXPORTERS, ExportWhat
from agl_bridge.store import SQLiteStore


def test_every_export_choice_has_an_exporter() -> None:
    assert set(EXPORTERS) == set(ExportWhat)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [({"file_format": "parquet"}, "JSON Lines only"), ({"options": ConvertOptions()}, "trajectories export only")],
)
async def test_calls_export_refuses_parquet_and_conversion_options(
    tmp_path: Path, overrides: dict[str, object], expected: str
) -> None:
    async with SQLiteStore(tmp_path / "store.db") as store:
        with pytest.raises(ValueError, match=expected):
            await EXPORTERS[ExportWhat.CALLS](store, tmp_path / "calls.jsonl", **overrides)  # type: ignore[arg-type]
    assert not (tmp_path / "calls.jsonl").exists()
