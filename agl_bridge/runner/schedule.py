"""The task schedule: which tasks step k runs, the same in every run with the same seed.

Positions k·B … k·B+B−1 of an endless sequence of seeded shuffles of the task set, epoch by epoch:
each epoch covers every task once, and a run resumed at step k repeats and skips nothing. Unshuffled, every
epoch takes the tasks in the order given: for a task list whose batches are designed (e.g. each batch of
Twenty Questions covering every list position once).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from agl_bridge.errors import ConfigError


class TaskSchedule:
    """Step k's tasks: positions k·B … k·B+B−1 of an endless sequence of seeded shuffles (or, with
    `shuffle=False`, of the tasks in their order, epoch after epoch)."""

    def __init__(self, tasks: Sequence[Any], batch_size: int, seed: int, *, shuffle: bool = True) -> None:
        if not tasks:
            raise ConfigError("the task set is empty")
        self.tasks = list(tasks)
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self._orders: dict[int, list[int]] = {}

    def for_step(self, step: int) -> list[Any]:
        """The tasks of one step (the same for a given step in every run with the same seed)."""
        out = []
        for position in range(step * self.batch_size, (step + 1) * self.batch_size):
            epoch, index = divmod(position, len(self.tasks))
            if epoch not in self._orders:
                order = list(range(len(self.tasks)))
                if self.shuffle:
                    random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
                self._orders[epoch] = order
            out.append(self.tasks[self._orders[epoch][index]])
        return out
