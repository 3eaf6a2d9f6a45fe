"""The trainer's worker ranks as Ray tasks (`trainer_launch = "ray"`): one placement group with a
bundle per worker rank, each rank a task that joins the driver's data-parallel group
(`agl_bridge.primitives.data_parallel`) and serves it until the run ends.

The driver (rank 0, the training process) stays where it is — with the proxy, the store and the
sampler — and hosts the group's store at this node's address; the cluster is the one this process
joined, else `ray_address` (or `RAY_ADDRESS`), else a local one started here and shut down with the
group.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from agl_bridge.primitives.data_parallel import DEFAULT_TIMEOUT_S, RankGroup, WorkerHandle, start_group


def missing_ray() -> ImportError:
    """The error for `trainer_launch = "ray"` without Ray installed."""
    return ImportError(
        'trainer_launch = "ray" needs Ray: pip install "agl-bridge[ray]" (or pip install ray) in this environment, '
        'or start the ranks here (leave trainer_launch unset or "processes")'
    )


def _serve_rank(environment: dict[str, str]) -> None:
    """A worker rank inside a Ray task: the launcher's variables, then the worker of a local launch."""
    from agl_bridge.primitives import data_parallel

    os.environ.update(environment)
    data_parallel.main()


@dataclass
class _RayTask:
    """A worker rank running as a Ray task."""

    ray: Any
    ref: Any

    def exit_status(self) -> str | None:
        ready, _ = self.ray.wait([self.ref], timeout=0)
        if not ready:
            return None
        try:
            self.ray.get(self.ref)
        except Exception as error:  # the task raised, or its worker or node died
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            return f"its Ray task failed: {reason}"
        return "its Ray task ended"

    def finish(self, timeout_s: float) -> None:
        ready, _ = self.ray.wait([self.ref], timeout=timeout_s)
        if not ready:
            self.ray.cancel(self.ref, force=True)


def ray_rank_group(
    world_size: int, *, timeout_s: float = DEFAULT_TIMEOUT_S, ray_address: str | None = None
) -> RankGroup:
    """Form a data-parallel group of `world_size` ranks whose workers are Ray tasks, this process rank 0."""
    try:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    except ImportError:
        raise missing_ray() from None
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(address=ray_address, include_dashboard=False, log_to_driver=True)
    gpus = 1 if torch.cuda.is_available() else 0
    bundle = {"CPU": 1.0, **({"GPU": 1.0} if gpus else {})}
    group_of_bundles = placement_group([dict(bundle) for _ in range(world_size - 1)], strategy="PACK")
    ray.get(group_of_bundles.ready(), timeout=timeout_s)
    # max_calls=1: the worker process ends with its rank, and its model replica with it.
    task = ray.remote(num_cpus=1, num_gpus=gpus, max_retries=0, max_calls=1)(_serve_rank)

    def start(rank: int, environment: dict[str, str]) -> WorkerHandle:
        strategy = PlacementGroupSchedulingStrategy(group_of_bundles, placement_group_bundle_index=rank - 1)
        return _RayTask(ray, task.options(scheduling_strategy=strategy).remote(environment))

    def release() -> None:
        remove_placement_group(group_of_bundles)
        if started_ray:
            ray.shutdown()

    try:
        group = start_group(world_size, start, address=ray.util.get_node_ip_address(), timeout_s=timeout_s)
    except BaseException:
        release()
        raise
    group.on_close.append(release)
    return group
