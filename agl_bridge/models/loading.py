"""Turn a user's ``--model`` value into a model directory or hub id, and load tokenizer/model from it.

Accepted values:

* ``tiny`` — the built-in offline test model, built on first use into
  ``$AGL_BRIDGE_CACHE/models/tiny-<fingerprint>`` (default cache ``~/.cache/agl_bridge``).
  ``tiny:hidden=64,layers=1,seed=3`` or ``tiny:family=gemma2`` overrides build arguments (see TinyModelSpec). The bare
  word always means the built-in model; a local directory called ``tiny`` is ``./tiny``.
* a local directory containing ``config.json`` (a Hugging Face model directory).
* a hub id such as ``Qwen/Qwen3-0.6B`` that is not an existing path: returned as is, and
  transformers resolves it from the local hub cache (or the network unless ``HF_HUB_OFFLINE=1``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

from agl_bridge.models.tiny import MARKER_FILENAME, InvalidTinySpecError, TinyModelSpec, build_tiny

TINY_NAME = "tiny"
"""The ``--model`` value that selects the built-in offline test model."""

CACHE_ENV_VAR = "AGL_BRIDGE_CACHE"
"""Environment variable naming agl_bridge's cache directory (default ``~/.cache/agl_bridge``)."""

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
"""Files of which at least one marks a directory as holding a tokenizer."""

_HINT = "pass --model tiny for the built-in test model, or a directory containing config.json"

# org/name with the characters the hub allows; deliberately no leading '.', '/' or '~'.
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


class ModelNotFoundError(ValueError):
    """A ``--model`` value names no usable model; the message says what was looked for and what to do."""


def cache_dir() -> Path:
    """agl_bridge's cache directory: ``$AGL_BRIDGE_CACHE`` or ``~/.cache/agl_bridge``."""
    configured = os.environ.get(CACHE_ENV_VAR)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "agl_bridge"


def parse_tiny_spec(name: str) -> TinyModelSpec | None:
    """The TinyModelSpec that ``tiny`` or ``tiny:key=value,...`` asks for, or None for other names."""
    if name == TINY_NAME:
        return TinyModelSpec()
    if not name.startswith(TINY_NAME + ":"):
        return None
    types = {f.name: f.type for f in fields(TinyModelSpec)}
    overrides: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in name[len(TINY_NAME) + 1 :].split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in types:
            raise ModelNotFoundError(
                f"bad tiny-model override {item!r} in {name!r}: expected key=value with key one of "
                f"{', '.join(types)}, e.g. 'tiny:hidden=64,layers=1,seed=3'"
            )
        convert = {"float": float, "str": str}.get(str(types[key]), int)
        try:
            overrides[key] = convert(value.strip())
        except ValueError:
            raise ModelNotFoundError(
                f"bad tiny-model override {item!r} in {name!r}: {key} must be "
                f"{'a number' if convert is float else 'an integer'}"
            ) from None
    spec = TinyModelSpec(**overrides)
    try:
        spec.validate()
    except InvalidTinySpecError as exc:
        raise ModelNotFoundError(f"bad tiny-model override in {name!r}: {exc}") from None
    return spec


def ensure_tiny_model(spec: TinyModelSpec | None = None) -> Path:
    """Path of the cached tiny build for ``spec``, building it first if it is not cached yet.

    The build goes into a private temporary directory next to the final one and is renamed into
    place; rename is atomic, so concurrent processes never see a half-written model. If two
    processes race, both build, one rename wins and the loser discards its copy.
    """
    spec = spec or TinyModelSpec()
    spec.validate()
    models_dir = cache_dir() / "models"
    final = models_dir / f"tiny-{spec.fingerprint()}"
    if final.exists():
        # Builds only ever appear here by an atomic rename, so a directory without a marker was
        # put here by something else.
        if (final / MARKER_FILENAME).is_file():
            return final
        raise ModelNotFoundError(
            f"{final} exists but is not a complete tiny-model build (no {MARKER_FILENAME}); "
            f"it was not written by agl_bridge's atomic build, so delete it and try again"
        )
    models_dir.mkdir(parents=True, exist_ok=True)
    # Not tempfile.mkdtemp: that makes the directory 0700, and the cache should honour the umask.
    staging = models_dir / f".{final.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    staging.mkdir()
    try:
        build_tiny(staging, spec)
        try:
            os.rename(staging, final)
        except OSError:
            # Another process renamed its build into place first; theirs is as good as ours.
            if not (final / MARKER_FILENAME).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def looks_like_hub_id(name: str) -> bool:
    """True for ``org/name`` strings that could be a Hugging Face hub repository id."""
    return bool(_HUB_ID.match(name)) and not name.endswith((".", "-")) and ".." not in name


def resolve_model_path(name_or_path: str | os.PathLike[str]) -> str:
    """Resolve a ``--model`` value to a local model directory or a hub id (see the module docs).

    Raises ModelNotFoundError when the value is a missing path, a file, or a directory without
    config.json.
    """
    if not isinstance(name_or_path, (str, os.PathLike)) or not str(name_or_path).strip():
        raise ModelNotFoundError(f"no model given (got {name_or_path!r}); {_HINT}")
    name = str(name_or_path).strip()
    tiny_spec = parse_tiny_spec(name)
    if tiny_spec is not None:
        return str(ensure_tiny_model(tiny_spec))
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"{path} is a directory but has no config.json, so it is not a Hugging Face model "
                f"directory (looked for config.json and tokenizer files: {', '.join(TOKENIZER_FILES)}); {_HINT}"
            )
        return str(path.resolve())
    if path.exists():
        raise ModelNotFoundError(f"{path} is a file, not a model directory containing config.json; {_HINT}")
    if looks_like_hub_id(name):
        return name
    raise ModelNotFoundError(
        f"model {name!r} not found: {path.absolute()} does not exist (looked for a directory containing "
        f"config.json and tokenizer files) and it is not a hub id of the form org/name; {_HINT}"
    )


def served_model_name(model: str) -> str:
    """The name clients ask for a ``--model`` value by: ``tiny`` for the built-in model (overrides
    included), else the directory's or hub id's last part (``Qwen/Qwen3-4B`` → ``Qwen3-4B``)."""
    return TINY_NAME if model.startswith(TINY_NAME) else Path(model.rstrip("/")).name


def _is_offline() -> bool:
    """Whether the user asked for offline hub access (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE)."""
    return any(
        os.environ.get(var, "").strip().lower() in {"1", "true", "yes", "on"}
        for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _hub_error(hub_id: str, what: str, exc: Exception) -> ModelNotFoundError:
    """The error for a hub id whose files could not be found locally or fetched."""
    where = "the local hub cache (offline mode is on)" if _is_offline() else "the local hub cache or the hub"
    return ModelNotFoundError(
        f"could not load the {what} of {hub_id!r} from {where}: {type(exc).__name__}: {str(exc).rstrip('. ')}. "
        f"The hub is unreachable or the model is not cached; download it where there is network "
        f"(e.g. `hf download {hub_id}`) and pass its local directory, or {_HINT}"
    )


def load_tokenizer(name_or_path: str | os.PathLike[str], **kwargs: Any):
    """Load the tokenizer of a ``--model`` value with AutoTokenizer (extra kwargs are passed on)."""
    from transformers import AutoTokenizer

    resolved = resolve_model_path(name_or_path)
    local = Path(resolved).is_dir()
    if local and not any((Path(resolved) / f).is_file() for f in TOKENIZER_FILES):
        raise ModelNotFoundError(
            f"{resolved} has no tokenizer (looked for {', '.join(TOKENIZER_FILES)}); save the "
            f"tokenizer into that directory (tokenizer.save_pretrained), or {_HINT}"
        )
    if local:
        # A directory is never a hub id, whatever it is called: never ask the network about it.
        kwargs.setdefault("local_files_only", True)
    try:
        return AutoTokenizer.from_pretrained(resolved, **kwargs)
    except OSError as exc:
        if local:
            raise
        raise _hub_error(resolved, "tokenizer", exc) from exc


def load_causal_lm(name_or_path: str | os.PathLike[str], *, device: str = "cpu", dtype: Any = None, **kwargs: Any):
    """Load a causal LM for a ``--model`` value with AutoModelForCausalLM, on ``device``, in eval mode.

    dtype: None (or "auto") keeps the dtype stored in the checkpoint; otherwise a torch.dtype or
    its name ("float32", "bfloat16", ...). Extra kwargs go to ``from_pretrained``.
    """
    import torch
    from transformers import AutoModelForCausalLM

    if isinstance(dtype, str) and dtype != "auto":
        resolved_dtype = getattr(torch, dtype, None)
        if not isinstance(resolved_dtype, torch.dtype):
            raise ValueError(f"unknown dtype {dtype!r}; expected e.g. 'float32', 'bfloat16', 'float16' or 'auto'")
        dtype = resolved_dtype
    resolved = resolve_model_path(name_or_path)
    local = Path(resolved).is_dir()
    if local:
        kwargs.setdefault("local_files_only", True)
    try:
        with _quiet_local_load(local):
            model = AutoModelForCausalLM.from_pretrained(resolved, dtype="auto" if dtype is None else dtype, **kwargs)
    except OSError as exc:
        if local:
            raise
        raise _hub_error(resolved, "model", exc) from exc
    # transformers wraps `PreTrainedModel.to` with functools.wraps, so its stub reads as unbound
    return model.to(device).eval()  # type: ignore[arg-type]


@contextlib.contextmanager
def _quiet_local_load(local: bool) -> Iterator[None]:
    """Hide transformers' per-tensor "Loading weights" bar for local loads (downloads keep theirs)."""
    from transformers.utils import logging as hf_logging

    if not local or not hf_logging.is_progress_bar_enabled():
        yield
        return
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()
