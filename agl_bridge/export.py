"""What `agl-bridge export --what` can write, and the function that writes each.

The two exports live with what they export: the store's calls and rewards
(`agl_bridge.store.export.export_calls`) and the converter's trajectories
(`agl_bridge.convert.export.export_trajectories`). This module sits above both and composes
them, so the store never reaches up to the converter. A new export is one more `ExportWhat`
member and one more entry in `EXPORTERS`.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Awaitable
from typing import Protocol

from agl_bridge.convert.export import export_trajectories
from agl_bridge.convert.policy import ConvertOptions
from agl_bridge.export_files import ExportCounts, ExportFormat
from agl_bridge.store.base import Store
from agl_bridge.store.export import export_calls


class ExportWhat(str, enum.Enum):
    """What `agl-bridge export --what` writes; a new export is one more member here and in `EXPORTERS`."""

    CALLS = "calls"
    TRAJECTORIES = "trajectories"


class Exporter(Protocol):
    """`exporter(store, out, *, rollout_id=None, file_format=JSONL, options=None)`: writes one export.

    Returns what it wrote. `options` (a `ConvertOptions`) is for the trajectories export only.
    """

    def __call__(
        self,
        store: Store,
        out: str | os.PathLike[str],
        *,
        rollout_id: str | None = ...,
        file_format: ExportFormat | str = ...,
        options: ConvertOptions | None = ...,
    ) -> Awaitable[ExportCounts]: ...


async def _calls_exporter(
    store: Store,
    out: str | os.PathLike[str],
    *,
    rollout_id: str | None = None,
    file_format: ExportFormat | str = ExportFormat.JSONL,
    options: ConvertOptions | None = None,
) -> ExportCounts:
    """`export_calls` behind the `Exporter` signature: ValueError for Parquet or conversion options."""
    if ExportFormat(file_format) is not ExportFormat.JSONL:
        raise ValueError("calls are exported as JSON Lines only; use format jsonl (Parquet is for trajectories)")
    if options is not None:
        raise ValueError("conversion options apply to the trajectories export only, not to calls")
    return await export_calls(store, out, rollout_id=rollout_id)


EXPORTERS: dict[ExportWhat, Exporter] = {
    ExportWhat.CALLS: _calls_exporter,
    ExportWhat.TRAJECTORIES: export_trajectories,
}
"""The function behind each `--what` value."""
