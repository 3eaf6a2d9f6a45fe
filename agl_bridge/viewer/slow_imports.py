"""The viewer's two slow loads — the trainer's advantages (the train package loads torch and peft) and a
tokenizer (transformers) — behind one lock.

They run in background threads at start and in request threads on first use; transformers' lazy
module loading is not thread-safe (two threads importing it at once fail with "cannot import name
AutoModel"), so they never run at the same time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agl_bridge.train.advantages import AdvantageBatch

_LOCK = threading.Lock()


def trainer_group_advantages() -> Callable[..., AdvantageBatch]:
    """`agl_bridge.train.advantages.group_advantages`, imported on first use."""
    with _LOCK:
        from agl_bridge.train.advantages import group_advantages

    return group_advantages


def load_tokenizer(model: str) -> Any:
    """The tokenizer of a `--model` value (`agl_bridge.models.loading.load_tokenizer`)."""
    with _LOCK:
        from agl_bridge.models.loading import load_tokenizer as load

        return load(model)
