"""`export_trajectories`: a store's trajectories into a JSON Lines or Parquet file, atomically and streamed.

Behind `agl-bridge export --what trajectories`. Converts rollout by rollout (`convert_store`) and
writes each trajectory as it comes, so memory holds one rollout plus one Parquet row group. The
file appears only once complete (`agl_bridge.export_files.atomic_output`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from agl_bridge.convert.io import open_writer
from agl_bridge.convert.policy import DEFAULT_OPTIONS, ConvertOptions
from agl_bridge.convert.records import ConversionReport
from agl_bridge.convert.stream import convert_store
from agl_bridge.export_files import ExportCounts, ExportFormat, atomic_output, closing_stream
from agl_bridge.store.base import Store
from agl_bridge.store.errors import RolloutNotFoundError


@dataclass(frozen=True, slots=True)
class TrajectoryExportCounts(ExportCounts):
    """What a trajectories export wrote: `calls` trained on, `rewards` seen, trajectories, and the report."""

    trajectories: int
    report: ConversionReport


async def export_trajectories(
    store: Store,
    out: str | os.PathLike[str],
    *,
    rollout_id: str | None = None,
    file_format: ExportFormat | str = ExportFormat.JSONL,
    options: ConvertOptions | None = None,
) -> TrajectoryExportCounts:
    """Write the trajectories of every rollout (or of `rollout_id`) to `out`; return counts and report.

    `calls` in the result counts the LLM calls trained on (merged into segments); `rewards` the
    reward records seen. Raises RolloutNotFoundError for a rollout the store has no row for,
    ExportOutputError (before converting anything) when `out` cannot be written, and
    MissingRewardError under `missing_reward="error"` (no file is written then).
    """
    chosen = ExportFormat(file_format)
    if rollout_id is not None and await store.get_rollout(rollout_id) is None:
        raise RolloutNotFoundError(rollout_id)
    report = ConversionReport()
    written = 0
    stream = convert_store(
        store,
        rollout_ids=None if rollout_id is None else [rollout_id],
        options=DEFAULT_OPTIONS if options is None else options,
        report=report,
    )
    with atomic_output(out, binary=chosen is ExportFormat.PARQUET) as handle:
        writer = open_writer(handle, chosen)
        try:
            async with closing_stream(stream) as trajectories:
                async for trajectory in trajectories:
                    writer.write(trajectory)
                    written += 1
        except BaseException:
            writer.abort()  # while the handle is open; the temporary file is then removed
            raise
        writer.close()
    return TrajectoryExportCounts(
        calls=report.calls_trained, rewards=report.rewards_seen, trajectories=written, report=report
    )
