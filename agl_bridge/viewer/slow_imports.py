"""The viewer's slow load — a tokenizer (transformers) — behind one lock.

It runs in a background thread at start and in request threads on first use; transformers' lazy
module loading is not thread-safe (two threads importing it at once fail with "cannot import name
AutoModel"), so the loads never run at the same time.
"""

from __future__ import annotations

import threading
from typing import Any

_LOCK = threading.Lock()


def load_tokenizer(model: str) -> Any:
    """The tokenizer of a `--model` value (`agl_bridge.models.loading.load_tokenizer`)."""
    with _LOCK:
        from agl_bridge.models.loading import load_tokenizer as load

        return load(model)
