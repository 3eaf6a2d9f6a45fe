"""A run's configuration (`GRPOConfig`, its sections in `config_schema.py`), loaded from TOML, YAML
or JSON with strict keys.

Unknown keys are refused by name (a typo must not silently fall back to a default), a key of a
section that does not belong to the run's kind (online, offline, follow, DPO) is refused by name
with the kind, values are checked for range by the section that defines them, and every field has
a default a user of this field would expect. Config files are flat: every key keeps its name.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
from pathlib import Path
from typing import Any

import yaml

from agl_bridge.errors import ConfigError
from agl_bridge.store.location import is_postgres_location
from agl_bridge.train.config_schema import (
    SECTIONS,
    TABLES,
    DPOConfig,
    FollowConfig,
    GRPOConfig,
    JudgeConfig,
    OverlongPenaltyConfig,
    RepetitionPenaltyConfig,
    WarmStartConfig,
)

__all__ = [
    "ConfigError",
    "DPOConfig",
    "FollowConfig",
    "GRPOConfig",
    "JudgeConfig",
    "OverlongPenaltyConfig",
    "SECTIONS",
    "RepetitionPenaltyConfig",
    "WarmStartConfig",
    "config_from_dict",
    "config_to_dict",
    "load_config",
]

REMOVED_KEYS = {
    "micro_batch_size": "max_batch_tokens (the most padded tokens per forward pass: each step's batch is split by "
    "tokens, which is what bounds memory)",
}
"""Keys earlier versions took, with what replaces each; a config that still sets one is refused by name."""


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> GRPOConfig:
    """Read a TOML (.toml), YAML (.yaml/.yml) or JSON (.json) config; unknown keys are errors."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(f"cannot read the config {path}: {error.strerror}") from None
    try:
        if path.suffix == ".toml":
            raw = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            raw = yaml.safe_load(text) or {}
        elif path.suffix == ".json":
            raw = json.loads(text)
        else:
            raise ConfigError(f"{path}: use a .toml, .yaml or .json config file")
    except (tomllib.TOMLDecodeError, yaml.YAMLError, json.JSONDecodeError) as error:
        raise ConfigError(f"{path} does not parse: {error}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must hold a mapping of settings")
    merged = {**raw, **(overrides or {})}
    base = path.resolve().parent
    for name in ("tasks", "eval_tasks", "validation_tasks", "adapter_dir", "litellm_config"):
        value = merged.get(name)
        if isinstance(value, str) and value and not Path(value).is_absolute():
            merged[name] = str(base / value)  # before validation, which may read the file
    for name in ("store", "offline_data"):  # a store, or offline data read from one: a file or a URL
        if _relative_file(merged.get(name)):
            merged[name] = str(base / merged[name])
    follow = merged.get("follow")
    if isinstance(follow, dict) and _relative_file(follow.get("store")):
        merged["follow"] = {**follow, "store": str(base / follow["store"])}
    dpo = merged.get("dpo")
    if (
        isinstance(dpo, dict)
        and isinstance(dpo.get("data"), str)
        and dpo["data"]
        and not Path(dpo["data"]).is_absolute()
    ):
        merged["dpo"] = {**dpo, "data": str(base / dpo["data"])}
    return config_from_dict(merged, where=str(path))


def config_from_dict(raw: dict[str, Any], *, where: str = "config") -> GRPOConfig:
    """Build and validate a GRPOConfig from a mapping; unknown keys are refused by name."""
    for key, replacement in REMOVED_KEYS.items():
        if key in raw:
            raise ConfigError(f"{where}: {key} was removed; use {replacement}")
    known = {f.name for f in dataclasses.fields(GRPOConfig)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; known keys: {', '.join(sorted(known))}")
    values = dict(raw)
    _check_types(values, GRPOConfig, where)
    for name, schema in TABLES.items():
        if values.get(name) is not None:
            values[name] = _table(values[name], name, schema, where)
    config = GRPOConfig(**values)
    config.validate()
    return config


def _table(value: Any, name: str, table: type, where: str) -> Any:
    """A nested settings table (one of TABLES) built from a mapping, its keys and types checked by name."""
    if isinstance(value, table):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: {name} must be a table of settings, got {value!r}")
    known = {f.name for f in dataclasses.fields(table)}
    bad = sorted(set(value) - known)
    if bad:
        raise ConfigError(f"{where}: unknown key '{name}.{bad[0]}'; known: {', '.join(sorted(known))}")
    _check_types(value, table, f"{where}: {name}")
    return table(**value)


_WANTED: dict[str, tuple[str, Any]] = {
    "int": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "float": (
        "a finite number",
        lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
    ),
    "float | None": ("a finite number or null", lambda v: v is None or _WANTED["float"][1](v)),
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "str": ("a string", lambda v: isinstance(v, str)),
    "str | None": ("a string or null", lambda v: v is None or isinstance(v, str)),
    "str | list[str]": (
        "a string or a list of strings",
        lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v)),
    ),
    "dict[str, float]": (
        "a table of names to finite numbers",
        lambda v: isinstance(v, dict) and all(isinstance(k, str) and _WANTED["float"][1](x) for k, x in v.items()),
    ),
}


def _check_types(values: dict[str, Any], schema: type, where: str) -> None:
    """Refuse a value of the wrong type by its key, before range checks would fail on it with a TypeError."""
    annotations = {f.name: str(f.type) for f in dataclasses.fields(schema)}
    for name, value in values.items():
        wanted = _WANTED.get(annotations.get(name, ""))
        if wanted is not None and not wanted[1](value):
            raise ConfigError(f"{where}: {name} must be {wanted[0]}, got {value!r}")


def config_to_dict(config: GRPOConfig) -> dict[str, Any]:
    """The config as plain data (saved next to the run for reproducibility)."""
    return dataclasses.asdict(config)


def _relative_file(store: object) -> bool:
    """Whether a store setting (`store`, `offline_data`) is a relative file path (a URL is not)."""
    return isinstance(store, str) and bool(store) and not is_postgres_location(store) and not Path(store).is_absolute()
