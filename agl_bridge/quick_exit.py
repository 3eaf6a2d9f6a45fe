"""Skip the interpreter's last garbage collection when one of our processes exits.

A process that has imported torch, transformers and LiteLLM tracks over a million objects, and
Python's shutdown walks them all before the process ends: 5-6 s of CPU for every `agl-bridge
train` on a 2-core machine, and as long again for its sampler process, which the trainer waits
for. Freezing the collector in the last exit handler leaves those objects to the operating system
(0.4 s); Python does not promise to run the finalizers of objects still alive at exit anyway, and
every resource that must be released (stores, servers, child processes) is closed explicitly first.
"""

from __future__ import annotations

import atexit
import gc


def skip_final_collection() -> None:
    """Freeze the collector at exit, after the exit handlers registered later (they run first)."""
    atexit.register(gc.freeze)
