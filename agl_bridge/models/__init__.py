"""Models for agl_bridge: the offline tiny test model and resolution/loading of ``--model`` values.

Importing this package is cheap: transformers and torch are imported only when a model is built
or loaded.
"""

from __future__ import annotations

from agl_bridge.models.loading import (
    ModelNotFoundError,
    cache_dir,
    ensure_tiny_model,
    load_causal_lm,
    load_tokenizer,
    resolve_model_path,
    served_model_name,
)
from agl_bridge.models.tiny import (
    ADDED_TOKENS,
    SPECIAL_TOKENS,
    InvalidTinySpecError,
    TinyBuildInfo,
    TinyModelSpec,
    build_tiny,
    build_tiny_model,
)

__all__ = [
    "ADDED_TOKENS",
    "SPECIAL_TOKENS",
    "InvalidTinySpecError",
    "ModelNotFoundError",
    "TinyBuildInfo",
    "TinyModelSpec",
    "build_tiny",
    "build_tiny_model",
    "cache_dir",
    "ensure_tiny_model",
    "load_causal_lm",
    "load_tokenizer",
    "resolve_model_path",
    "served_model_name",
]
