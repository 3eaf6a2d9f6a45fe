"""Read-only access to a store file: SQLite opened with `mode=ro`, one connection per thread.

The viewer never writes: every connection is opened read-only through a `file:` URI, so SQLite
itself refuses any write. In WAL mode readers never block a writer (a running `serve` or `train`
goes on committing while pages are read), and each page reads inside one short read transaction
(`snapshot`), so the numbers on one page agree with each other.

`changes()` is how the live pages learn that something was written: one dedicated connection asks
`PRAGMA data_version`, which changes whenever another connection committed — a constant-time
check, however large the store.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agl_bridge.store.errors import StoreError, StoreSchemaError
from agl_bridge.store.export import check_store_file
from agl_bridge.store.schema import SchemaMismatch, check_schema

ConnectionSetup = Callable[[sqlite3.Connection], None]
"""Called on each new connection (e.g. to register SQL functions)."""


class WatchedConnections:
    """What the read-only store openers share: the connections they opened (closed together) and a
    change counter over a mark of the store's committed state (`_mark`, one per backend)."""

    def __init__(self) -> None:
        self._opened: list[Any] = []
        self._lock = threading.Lock()
        self._watch_lock = threading.Lock()
        self._changes = 0
        self._last_mark: object = None

    def _mark(self) -> object:
        """Something that differs whenever another connection committed (a data version, a stamp)."""
        raise NotImplementedError

    def _opened_one(self, conn: Any) -> None:
        """Keep `conn` to close with the others."""
        with self._lock:
            self._opened.append(conn)

    def changes(self) -> int:
        """A counter that goes up whenever another connection committed since the last call."""
        with self._watch_lock:
            mark = self._mark()
            if mark != self._last_mark:
                self._last_mark = mark
                self._changes += 1
            return self._changes

    def close(self) -> None:
        """Close every connection this object opened."""
        with self._lock:
            opened, self._opened = self._opened, []
        for conn in opened:
            conn.close()


class ReadOnlyStore(WatchedConnections):
    """A store file opened read-only; raises NoStoreError / StoreSchemaError / StoreError on open.

    `setup` runs on every connection this object opens (one per thread that reads).
    """

    def __init__(self, path: str | Path, *, setup: ConnectionSetup | None = None, busy_timeout_s: float = 5.0) -> None:
        self.path = check_store_file(path)
        self.where = str(self.path)
        """How pages and messages name the store."""
        self.name = self.path.name
        """The store's short name (its file name)."""
        self._uri = f"{self.path.resolve().as_uri()}?mode=ro"
        self._setup = setup
        self._busy_timeout_s = busy_timeout_s
        self._local = threading.local()
        super().__init__()
        self._watcher = self._connect()
        self._last_mark = self._mark()

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self._uri, uri=True, timeout=self._busy_timeout_s, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise StoreError(
                f"cannot open store {self.path} read-only: {exc}; check the path and its permissions"
            ) from None
        try:
            check_schema(conn, str(self.path))
        except SchemaMismatch as exc:
            conn.close()
            raise StoreSchemaError(str(exc)) from None
        except sqlite3.OperationalError as exc:
            conn.close()
            raise StoreError(
                f"cannot read store {self.path}: {exc}; check the file and its folder are readable"
            ) from None
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise StoreSchemaError(
                f"{self.path} is not an agl_bridge store (not a SQLite database: {exc}); pass the store file "
                "your proxy or trainer records into"
            ) from None
        if self._setup is not None:
            self._setup(conn)
        self._opened_one(conn)
        return conn

    def connection(self) -> sqlite3.Connection:
        """This thread's read-only connection (opened on first use)."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
        return conn

    @contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection inside one read transaction: every query sees the same committed state."""
        conn = self.connection()
        if conn.in_transaction:  # nested use: the outer snapshot holds
            yield conn
            return
        conn.execute("BEGIN")
        try:
            yield conn
        except sqlite3.Error as exc:
            raise StoreError(f"could not read store {self.path}: {exc}") from exc
        finally:
            if conn.in_transaction:
                conn.execute("COMMIT")

    def _mark(self) -> int:
        return int(self._watcher.execute("PRAGMA data_version").fetchone()[0])
