"""Read-only access to a PostgreSQL store for the viewer: `ReadOnlyStore`'s interface on a `postgresql://` URL.

The pages' queries are written once, in SQLite's dialect (`listing.py`, `records.py`,
`trained.py`), and run here through `PostgresConnection`, which rewrites the few SQLite-only
pieces they use into PostgreSQL's (`to_postgres`):
  - `?` placeholders → `%s` (and a literal `%` → `%%`);
  - `rowid` of `rollouts` → `created_order`, the identity column that gives creation order there;
  - `group_concat(DISTINCT x)` → `string_agg(DISTINCT x, ',')`;
  - `x GLOB ?` → `x ~ ?`, its pattern argument turned into the anchored regular expression;
  - the `agl_return(name, value)` aggregate (a Python function in SQLite) → a `sum` of the values
    weighted by a CASE over the run's reward weights, inlined as constants.
A call's response text is BYTEA there (text cannot hold NUL); `records.py` decodes it as
`PostgresStore` does. Everything else (LIKE … ESCAPE, NULLS LAST, LIMIT/OFFSET, subqueries) is
the same in both.

Read-only twice over: every session runs with `default_transaction_read_only`, and each page
reads inside one REPEATABLE READ READ ONLY transaction (`snapshot`), so the numbers on one page
agree with each other while writers go on committing. One connection per thread that reads.

`changes()` is SQLite's `PRAGMA data_version` here: a stamp of what the store holds — the newest
call, reward and span ids (identity columns: an index lookup each), and the rollouts' and
attempts' counts and latest update times (rollout states, consumed marks, attempt ends) — taken
on one dedicated connection; a different stamp counts as one change.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from agl_bridge.convert import ConvertOptions
from agl_bridge.store.errors import StoreError
from agl_bridge.store.postgres_check import check_store_tables, connect_read_only
from agl_bridge.store.postgres_writer import describe_dsn
from agl_bridge.viewer.db import WatchedConnections

_ROWID = re.compile(r"\browid\b")
_GROUP_CONCAT = re.compile(r"group_concat\(DISTINCT ([\w.]+)\)")
_RETURN_CALL = re.compile(r"agl_return\(([\w.]+), ([\w.]+)\)")
_GLOB = re.compile(r"GLOB\s*$")

_STAMP = (
    "SELECT (SELECT coalesce(max(id), 0) FROM llm_calls), (SELECT coalesce(max(id), 0) FROM rewards), "
    "(SELECT coalesce(max(id), 0) FROM spans), "
    "(SELECT row(count(*), count(consumed_step), max(updated_at))::text FROM rollouts), "
    "(SELECT row(count(*), count(ended_at), max(ended_at))::text FROM attempts)"
)


def glob_to_regex(pattern: str) -> str:
    """SQLite's GLOB pattern (`*`, `?`, `[...]`) as an anchored POSIX regular expression."""
    out, index = ["^"], 0
    while index < len(pattern):
        char = pattern[index]
        if char == "*":
            out.append(".*")
        elif char == "?":
            out.append(".")
        elif char == "[" and (end := pattern.find("]", index + 2)) != -1:
            body = pattern[index + 1 : end]
            out.append("[" + ("^" + body[1:] if body.startswith("^") else body) + "]")
            index = end
        else:
            out.append(re.escape(char))
        index += 1
    return "".join(out) + "$"


def return_sql(options: ConvertOptions, name: str, value: str) -> str:
    """`agl_return(name, value)` as plain SQL: the sum of each value times its reward's weight (NULL for none)."""
    cases = " ".join(
        f"WHEN '{reward.replace(chr(39), chr(39) * 2)}' THEN float8 '{weight!r}'"
        for reward, weight in sorted(options.reward_weights.items())
    )
    default = f"float8 '{options.default_reward_weight!r}'"
    return f"sum({value} * {f'CASE {name} {cases} ELSE {default} END' if cases else default})"


def to_postgres(sql: str, options: ConvertOptions) -> tuple[str, frozenset[int]]:
    """A viewer query in PostgreSQL's dialect, and the indexes of its arguments that are GLOB patterns."""
    sql = _RETURN_CALL.sub(lambda match: return_sql(options, match[1], match[2]), sql)
    sql = _GROUP_CONCAT.sub(r"string_agg(DISTINCT \1, ',')", _ROWID.sub("created_order", sql))
    parts = sql.replace("%", "%%").split("?")
    globs: set[int] = set()
    for index, part in enumerate(parts[:-1]):
        if _GLOB.search(part):
            parts[index] = _GLOB.sub("~ ", part)
            globs.add(index)
    return "%s".join(parts), frozenset(globs)


class PostgresConnection:
    """A psycopg connection that runs the viewer's SQLite-dialect queries (`to_postgres`)."""

    def __init__(self, conn: Any, options: ConvertOptions) -> None:
        self.raw = conn
        self._options = options
        self._translated: dict[str, tuple[str, frozenset[int]]] = {}

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Any:
        """Run one query written for SQLite; returns the psycopg cursor (fetchone, fetchall, iteration)."""
        translated = self._translated.get(sql)
        if translated is None:
            translated = self._translated[sql] = to_postgres(sql, self._options)
        text, globs = translated
        args = [glob_to_regex(value) if index in globs else value for index, value in enumerate(parameters)]
        return self.raw.execute(text, args)


class PostgresReadOnlyStore(WatchedConnections):
    """A PostgreSQL store opened read-only; raises StoreError (NoStoreError, StoreSchemaError, …) on open.

    options: the run's conversion options, for the `agl_return` aggregate the lists sort and filter by.
    """

    def __init__(self, dsn: str, *, options: ConvertOptions | None = None) -> None:
        self.dsn = dsn
        self.where = describe_dsn(dsn)
        self.name = self.where.split("/", 3)[-1].split(" ")[0]
        self._options = options or ConvertOptions()
        self._local = threading.local()
        super().__init__()
        self._watcher = self._connect()
        try:
            check_store_tables(self._watcher, self.where)
        except BaseException:
            self.close()
            raise
        self._last_mark = self._mark()

    def _connect(self) -> Any:
        conn = connect_read_only(self.dsn, where=self.where)
        conn.execute("SET default_transaction_read_only = on")
        self._opened_one(conn)
        return conn

    def _read_error(self, exc: BaseException) -> StoreError:
        import psycopg

        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        advice = (
            "; check that the server is up (the next page reconnects)"
            if isinstance(exc, psycopg.OperationalError)
            else ""
        )
        return StoreError(f"could not read the PostgreSQL store {self.where}: {reason}{advice}")

    def connection(self) -> PostgresConnection:
        """This thread's read-only connection (opened on first use, again after it broke)."""
        conn: PostgresConnection | None = getattr(self._local, "conn", None)
        if conn is None or conn.raw.closed or conn.raw.broken:
            conn = PostgresConnection(self._connect(), self._options)
            self._local.conn = conn
        return conn

    @contextmanager
    def snapshot(self) -> Iterator[PostgresConnection]:
        """This thread's connection inside one REPEATABLE READ READ ONLY transaction (one committed state)."""
        import psycopg

        conn = self.connection()
        if getattr(self._local, "depth", 0):  # nested use: the outer snapshot holds
            yield conn
            return
        self._local.depth = 1
        try:
            conn.raw.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield conn
        except psycopg.Error as exc:
            raise self._read_error(exc) from exc
        finally:
            self._local.depth = 0
            if not conn.raw.closed and not conn.raw.broken:
                conn.raw.execute("ROLLBACK")  # read only: nothing to commit, and an aborted one ends too

    def _mark(self) -> tuple[Any, ...]:
        import psycopg

        try:
            if self._watcher.closed or self._watcher.broken:
                self._watcher = self._connect()
            return tuple(self._watcher.execute(_STAMP).fetchone())
        except psycopg.Error as exc:
            raise self._read_error(exc) from exc
