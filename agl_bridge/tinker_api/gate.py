"""One in-process sampler serving several pinned weight snapshots, one at a time.

A Tinker sampling session is pinned to the weights it was made from (`kind="snapshot"`), while the
training run goes on. The sampler holds one set of weights, so requests for the loaded snapshot run
together, and a request for another snapshot waits until they finish, loads its weights (a LoRA
merge: milliseconds for the tiny model, ~60 ms for a 0.6B one on a GPU) and runs. A request waiting
for another snapshot holds back new requests for the loaded one, so no snapshot waits forever.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from agl_bridge.primitives.client import SamplerWeights
from agl_bridge.sampler.hf import HFSampler


class SamplerGate:
    """Serialises weight switches on `sampler` against the requests sampling from it."""

    def __init__(self, sampler: HFSampler, loaded: str | None = None) -> None:
        self.sampler = sampler
        self._loaded = loaded
        self._users = 0
        self._switching = 0
        self._condition = asyncio.Condition()

    @asynccontextmanager
    async def holding(self, key: str, weights: SamplerWeights) -> AsyncIterator[HFSampler]:
        """The sampler with snapshot `key` (whose weights are `weights`) loaded, for the duration."""
        async with self._condition:
            other = self._loaded != key
            self._switching += other
            try:
                await self._condition.wait_for(
                    lambda: self._users == 0 or (self._loaded == key and not self._switching)
                )
            finally:
                self._switching -= other
            if self._loaded != key:
                await asyncio.to_thread(weights.load_into, self.sampler)
                self._loaded = key
            self._users += 1
        try:
            yield self.sampler
        finally:
            async with self._condition:
                self._users -= 1
                self._condition.notify_all()
