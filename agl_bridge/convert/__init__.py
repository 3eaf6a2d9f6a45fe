"""Stored LLM calls and rewards → trajectories: reward attribution, multi-turn merge, masks, export.

`convert_store` streams a store's succeeded attempts into `Trajectory` records (one rollout in
memory at a time); `convert_attempt` is the pure per-attempt function it applies;
`read_trajectories` / `write_trajectories` move them through JSON Lines or Parquet files. The
rules and the schema: docs/trajectories.md.
"""

from __future__ import annotations

from agl_bridge.convert.errors import ConversionError, MissingRewardError, TrajectoryFormatError
from agl_bridge.convert.export import TrajectoryExportCounts, export_trajectories
from agl_bridge.convert.graph import CallNode, RolloutGraph, build_graph
from agl_bridge.convert.groups import group_key, group_trajectories
from agl_bridge.convert.io import (
    check_segment,
    iter_trajectories,
    read_trajectories,
    trajectory_from_json,
    trajectory_to_json,
    write_trajectories,
)
from agl_bridge.convert.policy import (
    ALL_CALL_CLASSES,
    DEFAULT_OPTIONS,
    DEFAULT_TRAIN_CLASSES,
    ConvertOptions,
    MissingRewardPolicy,
)
from agl_bridge.convert.records import (
    ConversionReport,
    DropReason,
    ExcludedCall,
    SegmentCall,
    SplitKind,
    Trajectory,
    TrajectorySegment,
)
from agl_bridge.convert.stream import convert_rollout, convert_rollout_attempts, convert_store, effective_status
from agl_bridge.convert.trajectory import convert_attempt

__all__ = [
    "ALL_CALL_CLASSES",
    "DEFAULT_OPTIONS",
    "DEFAULT_TRAIN_CLASSES",
    "CallNode",
    "ExcludedCall",
    "RolloutGraph",
    "build_graph",
    "ConversionError",
    "ConversionReport",
    "ConvertOptions",
    "DropReason",
    "MissingRewardError",
    "MissingRewardPolicy",
    "SegmentCall",
    "SplitKind",
    "Trajectory",
    "TrajectoryExportCounts",
    "TrajectoryFormatError",
    "TrajectorySegment",
    "check_segment",
    "convert_attempt",
    "convert_rollout",
    "convert_rollout_attempts",
    "convert_store",
    "effective_status",
    "export_trajectories",
    "group_key",
    "group_trajectories",
    "iter_trajectories",
    "read_trajectories",
    "trajectory_from_json",
    "trajectory_to_json",
    "write_trajectories",
]
