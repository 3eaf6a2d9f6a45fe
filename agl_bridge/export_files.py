"""What every export shares, below the store and the converter: file formats, atomic files, counts, stream closing.

The store's calls export (`agl_bridge.store.export`) and the converter's trajectories export
(`agl_bridge.convert.export`) both write through `atomic_output`: a temporary file next to the
target (mode 0600, like the store: prompts may be private), renamed over it only once complete, so
a failed export leaves no partial file. Which export `agl-bridge export --what` runs is decided
above both, in `agl_bridge.export`.
"""

from __future__ import annotations

import enum
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar


class ExportFormat(str, enum.Enum):
    """The file format of an export (`--format`): calls are JSON Lines only; trajectories either."""

    JSONL = "jsonl"
    PARQUET = "parquet"


class ExportOutputError(Exception):
    """The export file cannot be written (missing or read-only directory, a directory in the way, disk full)."""


@dataclass(frozen=True, slots=True)
class ExportCounts:
    """How many records an export wrote: LLM calls and rewards (a trajectories export adds its own counts)."""

    calls: int
    rewards: int


T = TypeVar("T")


@asynccontextmanager
async def closing_stream(stream: AsyncIterator[T]) -> AsyncIterator[AsyncIterator[T]]:
    """Yield `stream`, then close it (if it is an async generator) even when left early.

    A store stream abandoned mid-way would otherwise be finalised whenever the garbage collector
    gets to it, possibly after its store was closed.
    """
    try:
        yield stream
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()


@contextmanager
def atomic_output(out: str | os.PathLike[str], *, binary: bool = False) -> Iterator[IO[Any]]:
    """Yield a handle on a private temporary file that replaces `out` only if the block completes.

    The file is fsynced before the rename. ExportOutputError (one line, naming `out`) when it
    cannot be created or written; on any error the temporary file is removed and `out` is left
    as it was.
    """
    target = Path(out)
    temporary, handle = _open_temporary(target, binary=binary)
    try:
        with handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except OSError as exc:
        raise ExportOutputError(
            f"could not write {target}: {exc.strerror or exc}; free disk space or write somewhere else"
        ) from None
    finally:
        temporary.unlink(missing_ok=True)  # a no-op after the rename


def _open_temporary(target: Path, *, binary: bool = False) -> tuple[Path, IO[Any]]:
    """Create the hidden temporary file the export is written into, checking `target` first."""
    parent = target.parent
    if target.is_dir():
        raise ExportOutputError(f"{target} is a directory; give a file path such as {target / 'calls.jsonl'}")
    if not parent.is_dir():
        what = "is not a directory" if parent.exists() else "does not exist"
        raise ExportOutputError(f"cannot write {target}: {parent} {what}; create the directory first")
    temporary = parent / f".{target.name}.{os.getpid()}.tmp"
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError as exc:
        raise ExportOutputError(
            f"cannot write {target}: {exc.strerror or exc} in {parent}; write somewhere you have write access"
        ) from None
    if binary:
        return temporary, os.fdopen(fd, "wb")
    return temporary, os.fdopen(fd, "w", encoding="utf-8", newline="\n")
