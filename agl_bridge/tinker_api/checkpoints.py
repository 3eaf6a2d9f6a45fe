"""`tinker://` checkpoint paths ⇄ directories under the server's root.

The SDK reads a path as `tinker://<model_id>/<kind>/<name>` with exactly three parts, kind one of
`weights` (a training state: adapter + optimizer), `sampler_weights` (an adapter to sample with). On
disk: `<root>/<model_id>/<kind>/<name>/`, so a checkpoint outlives the server process and a later
server over the same root resumes from it.
"""

from __future__ import annotations

import datetime
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Kind = Literal["weights", "sampler_weights"]

SCHEME = "tinker://"
RUN_FILE = "tinker_run.json"
"""Per training run: its base model name and LoRA settings, so that a checkpoint can be loaded again."""

_CHECKPOINT_TYPES: dict[str, str] = {"weights": "training", "sampler_weights": "sampler"}


class CheckpointPathError(ValueError):
    """A `tinker://` path that is malformed or names no checkpoint here (a "user" error)."""


@dataclass(frozen=True)
class CheckpointPath:
    """One parsed checkpoint path."""

    model_id: str
    kind: Kind
    name: str

    @classmethod
    def parse(cls, text: str) -> CheckpointPath:
        """Read `tinker://<model_id>/<kind>/<name>`; CheckpointPathError saying what a path looks like."""
        parts = text.removeprefix(SCHEME).split("/") if text.startswith(SCHEME) else []
        if len(parts) != 3 or parts[1] not in _CHECKPOINT_TYPES or not all(parts):
            raise CheckpointPathError(
                f"{text!r} is not a checkpoint path; expected tinker://<model_id>/weights/<name> or "
                "tinker://<model_id>/sampler_weights/<name>, as save_state / save_weights_for_sampler return"
            )
        check_name(parts[0])  # a model id of ".." would lead out of the checkpoint directory
        check_name(parts[2])
        return cls(parts[0], parts[1], parts[2])  # type: ignore[arg-type]  # checked against _CHECKPOINT_TYPES

    def __str__(self) -> str:
        return f"{SCHEME}{self.model_id}/{self.kind}/{self.name}"

    @property
    def checkpoint_id(self) -> str:
        """The id the SDK's REST calls use: `<kind>/<name>`."""
        return f"{self.kind}/{self.name}"

    def directory(self, root: Path) -> Path:
        """Where the checkpoint lives under `root`."""
        return root / self.model_id / self.kind / self.name


def check_name(name: str) -> str:
    """A checkpoint name (or model id) is one path segment inside the checkpoint directory; CheckpointPathError
    otherwise."""
    if not name or "/" in name or "\\" in name or name in (".", ".."):
        raise CheckpointPathError(
            f"{name!r} must be one path segment (no '/', not '..'), e.g. '000020': checkpoints stay in the "
            "server's checkpoint directory"
        )
    return name


def write_run_file(root: Path, model_id: str, settings: dict[str, Any]) -> None:
    """Record a run's settings beside its checkpoints."""
    directory = root / model_id
    directory.mkdir(parents=True, exist_ok=True)
    (directory / RUN_FILE).write_text(json.dumps(settings, indent=2))


def read_run_file(root: Path, model_id: str) -> dict[str, Any]:
    """A run's settings; CheckpointPathError when the run is unknown under `root`."""
    path = root / model_id / RUN_FILE
    if not path.is_file():
        raise CheckpointPathError(f"no training run {model_id!r} under {root}; check the checkpoint path")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def list_checkpoints(root: Path, model_id: str) -> list[dict[str, Any]]:
    """The SDK's `Checkpoint` records of a run, oldest first."""
    found = []
    for kind, checkpoint_type in _CHECKPOINT_TYPES.items():
        directory = root / model_id / kind
        for entry in sorted(directory.iterdir()) if directory.is_dir() else []:
            if not entry.is_dir():
                continue
            path = CheckpointPath(model_id, kind, entry.name)  # type: ignore[arg-type]
            stat = entry.stat()
            found.append(
                {
                    "checkpoint_id": path.checkpoint_id,
                    "checkpoint_type": checkpoint_type,
                    "time": datetime.datetime.fromtimestamp(stat.st_mtime, datetime.UTC).isoformat(),
                    "tinker_path": str(path),
                    "size_bytes": sum(f.stat().st_size for f in entry.rglob("*") if f.is_file()),
                    "public": False,
                }
            )
    return sorted(found, key=lambda record: record["time"])


def delete_checkpoint(root: Path, model_id: str, checkpoint_id: str) -> None:
    """Remove `<kind>/<name>` of a run; CheckpointPathError when there is no such checkpoint."""
    path = CheckpointPath.parse(f"{SCHEME}{model_id}/{checkpoint_id}")
    directory = path.directory(root)
    if not directory.is_dir():
        raise CheckpointPathError(f"no checkpoint {path}")
    shutil.rmtree(directory)
