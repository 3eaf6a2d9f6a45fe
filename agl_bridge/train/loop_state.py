"""The training loop's checkpoints: the client's state plus where the loop stands, and resuming from them.

`run_dir/checkpoints/step_NNNNNN/` holds a `TrainingClient.save_state` directory plus
`grpo_state.json` (the next step, the held-out reward at the start, the seed). Because step k
always takes the same tasks (a seeded schedule), resuming at the next step repeats and skips nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from agl_bridge.errors import ConfigError
from agl_bridge.primitives.client import TrainingClient
from agl_bridge.train.run_log import RunLog, drop_records_after

CHECKPOINTS = "checkpoints"
"""The folder of a run's checkpoints, under run_dir."""

LOOP_STATE = "grpo_state.json"
"""The loop position saved next to the client state in each checkpoint."""


def save_checkpoint(
    client: TrainingClient,
    run_dir: Path,
    next_step: int,
    eval_start: float | None,
    seed: int,
    log: RunLog,
    extra: dict[str, Any] | None = None,
) -> None:
    """Save the client state and the loop position as `run_dir/checkpoints/step_<next_step>`.

    `extra`: more of a loop's position, JSON-able (the follow loop's policy version and start time).
    """
    path = run_dir / CHECKPOINTS / f"step_{next_step:06d}"
    client.save_state(path)
    # Written to a temporary name and renamed: a kill mid-write must not leave a torn state file
    # that --resume would pick as the latest checkpoint.
    partial = path / f"{LOOP_STATE}.partial"
    partial.write_text(json.dumps({**(extra or {}), "next_step": next_step, "eval_start": eval_start, "seed": seed}))
    os.replace(partial, path / LOOP_STATE)
    log.say(f"checkpoint {path}")


def resume_latest(
    client: TrainingClient, run_dir: Path, seed: int, log: RunLog, *, sync: bool = True
) -> dict[str, Any] | None:
    """Load the latest checkpoint into `client` and return its loop state (None: no checkpoint, start afresh).

    With `sync`, the restored adapter goes to the sampler at once. Metrics records of steps after
    the checkpoint (a run killed before checkpointing them) are dropped: those steps run again.
    """
    candidates = sorted((run_dir / CHECKPOINTS).glob(f"step_*/{LOOP_STATE}"))
    if not candidates:
        log.say(f"no checkpoint in {run_dir / CHECKPOINTS}; starting from scratch")
        return None
    state_file = candidates[-1]
    state = json.loads(state_file.read_text())
    if state.get("seed") != seed:
        raise ConfigError(
            f"{state_file.parent} was written with seed {state.get('seed')}, the config has {seed}; "
            "resuming with another seed would change which tasks each step takes"
        )
    client.load_state(state_file.parent)
    if sync:
        client.save_weights_and_get_sampling_client()
    dropped = drop_records_after(run_dir, int(state["next_step"]))
    log.say(
        f"resumed from {state_file.parent}: next step {state['next_step'] + 1}"
        + (f" ({dropped} metrics records after it dropped)" if dropped else "")
    )
    return state
