"""Errors raised by stores; each message says what was wrong, what was expected and what to do."""

from __future__ import annotations

from agl_bridge.types import InvalidTransitionError

__all__ = [
    "AttemptFinishedError",
    "AttemptNotFoundError",
    "DuplicateRecordError",
    "InvalidTransitionError",
    "NoStoreError",
    "RolloutNotFoundError",
    "StoreClosedError",
    "StoreConflictError",
    "StoreError",
    "StoreSchemaError",
    "StoreUnavailableError",
    "StoreWriteError",
    "TaskConflictError",
]


class StoreError(Exception):
    """Base class of every store error."""


class NoStoreError(StoreError):
    """No store where one was named: a missing, empty or directory path, or a database without a store.

    Read-only commands raise it instead of creating a fresh empty store there.
    """


class StoreSchemaError(StoreError):
    """The store file is not an agl_bridge store of the schema version this code understands."""


class StoreWriteError(StoreError):
    """A write could not be committed (disk full, file locked, I/O error); nothing was half-written."""

    def __init__(self, path: str, cause: BaseException, what: str = "write") -> None:
        reason = str(cause) or type(cause).__name__
        super().__init__(f"could not {what} store {path}: {reason}; {_advice(reason)}")
        self.path = path
        self.cause = cause


def _advice(reason: str) -> str:
    lowered = reason.lower()
    if "full" in lowered:
        return "free disk space (or raise the store's size limit) and retry; the records were not written"
    if "locked" in lowered or "busy" in lowered:
        return (
            "another process holds a write lock on it for longer than the busy timeout; stop that "
            "process or raise busy_timeout_s, then retry; the records were not written"
        )
    if "readonly" in lowered or "read-only" in lowered:
        return "make the file and its directory writable by this user and retry"
    return "check the file system and retry; the records were not written"


class StoreUnavailableError(StoreWriteError):
    """The store's database server cannot be reached (down, restarting, network); nothing was written.

    The store reconnects on its next use, so a caller retries once the server is back (the proxy
    answers 503 `store_unavailable` meanwhile).
    """

    def __init__(self, where: str, cause: BaseException | str) -> None:
        reason = _first_line(str(cause)) or type(cause).__name__
        StoreError.__init__(
            self,
            f"store {where} is unreachable ({reason}); nothing was written: retry once the database server is back",
        )
        self.path = where
        self.cause = cause if isinstance(cause, BaseException) else StoreError(cause)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0].strip() if text.strip() else ""


class StoreClosedError(StoreError):
    """The store was used before `open()` or after `close()`."""


class RolloutNotFoundError(StoreError, LookupError):
    """No rollout with the given id exists in the store."""

    def __init__(self, rollout_id: str) -> None:
        super().__init__(f"no rollout {rollout_id!r} in the store; create it with create_rollout() first")
        self.rollout_id = rollout_id


class AttemptNotFoundError(StoreError, LookupError):
    """No attempt with the given id (of the given rollout, when one is named) exists in the store."""

    def __init__(self, attempt_id: str, rollout_id: str | None = None) -> None:
        where = "" if rollout_id is None else f" of rollout {rollout_id!r}"
        super().__init__(
            f"no attempt {attempt_id!r}{where} in the store; an attempt exists once it started: "
            "its first call, reward or start request registers it (start_attempt() for the runner)"
        )
        self.attempt_id = attempt_id
        self.rollout_id = rollout_id


class StoreConflictError(StoreError):
    """A request conflicts with what the store already holds (HTTP 409); the message names both."""


class AttemptFinishedError(StoreConflictError):
    """An attempt (or its rollout) is already finished, so it takes no reward, start or finish any more."""


class TaskConflictError(StoreConflictError):
    """A rollout was named for one task and is now claimed for another."""


class DuplicateRecordError(StoreError, ValueError):
    """A record claims a (rollout, attempt, sequence) slot that another record already holds."""
