"""Whether a PostgreSQL URL names a store a read-only command can read, said in one line with the fix.

`inspect`, `export`, `view` and offline training read a store that must already exist: they never
create one (a mistyped database name would otherwise get a fresh empty store, and an empty listing
instead of an error). `check_postgres_store` connects once, before the command opens the store, and
turns what can go wrong into one line naming host, port and database (never the password) and
what to do: no server listening (or a dead host), a refused login (wrong password, unknown role,
no pg_hba entry), a missing database, a database without our tables, a schema of another version
(the version rule is `postgres_schema.ensure_schema`'s, which writes nothing to an existing store).
"""

from __future__ import annotations

from typing import Any

from agl_bridge._version import __version__
from agl_bridge.store.errors import NoStoreError, StoreError, StoreSchemaError
from agl_bridge.store.postgres_schema import ensure_schema
from agl_bridge.store.postgres_writer import describe_dsn, without_secrets
from agl_bridge.store.schema import VERSION_TABLE, SchemaMismatch

CONNECT_TIMEOUT_S = 5
"""How long a read-only command waits for the server before calling it unreachable."""

# SQLSTATE classes of a refused connection (PostgreSQL's errcodes).
_BAD_PASSWORD = "28P01"
_NOT_AUTHORIZED = "28000"
_NO_DATABASE = "3D000"


class StoreConnectionError(StoreError):
    """A PostgreSQL store cannot be connected to; the message names host, port, the reason and the fix."""


def connection_advice(reason: str, sqlstate: str | None) -> str:
    """What to do about a failed connection, from its SQLSTATE (server refusals) or its text (network)."""
    lowered = reason.lower()
    if sqlstate == _BAD_PASSWORD or "password authentication failed" in lowered:
        return "check the user and password in the URL (or PGPASSWORD / ~/.pgpass)"
    if "no password supplied" in lowered:
        return "put the password in the URL (postgresql://user:PASSWORD@host:port/db), PGPASSWORD or ~/.pgpass"
    if sqlstate == _NO_DATABASE or ("database" in lowered and "does not exist" in lowered):
        return "check the database name in the URL: it is the one the proxy's --store (or the run's store) names"
    if sqlstate == _NOT_AUTHORIZED or "role" in lowered or "pg_hba" in lowered:
        return "check the user name in the URL, and that the server's pg_hba.conf lets it connect from here"
    if "refused" in lowered or "no such file" in lowered:
        return "nothing listens there: start the PostgreSQL server, or fix the host and port in the URL"
    if "timeout" in lowered or "timed out" in lowered:
        return (
            f"the host did not answer within {CONNECT_TIMEOUT_S} s: check the host and port in the URL, "
            "and that it is up and reachable from here"
        )
    if "translate host name" in lowered or "name or service not known" in lowered:
        return "the host name does not resolve: fix the host in the URL"
    return "check the URL (host, port, database, user, password) and that the server is up"


def connect_read_only(dsn: str, *, where: str | None = None) -> Any:
    """A psycopg connection (autocommit) to `dsn`, or StoreConnectionError saying why and what to do."""
    import psycopg

    where = where or describe_dsn(dsn)
    try:
        return psycopg.connect(dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
    except psycopg.Error as exc:
        reason = without_secrets(exc, dsn)
        raise StoreConnectionError(
            f"cannot connect to the PostgreSQL store {where}: {reason}; "
            f"{connection_advice(reason, getattr(exc, 'sqlstate', None))}"
        ) from None


def check_store_tables(conn: Any, where: str) -> None:
    """Raise NoStoreError / StoreSchemaError unless `conn`'s database holds a store of this schema version."""
    import psycopg

    try:
        schema, tables = conn.execute(
            "SELECT current_schema(), (SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = current_schema())"
        ).fetchone()
        if not tables:
            raise NoStoreError(
                f"the PostgreSQL database {where} holds no agl_bridge store (schema {schema or '(none)'} has no "
                f"tables, no {VERSION_TABLE}); check the database in the URL: it is the one the proxy's --store "
                "(or the run's store) names"
            )
        ensure_schema(conn, where, f"agl_bridge {__version__}")  # tables exist: only checks their version
    except SchemaMismatch as exc:
        raise StoreSchemaError(str(exc)) from None
    except psycopg.Error as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise StoreConnectionError(
            f"cannot read the PostgreSQL store {where}: {reason}; check that the user in the URL may read it"
        ) from None


def check_postgres_store(dsn: str) -> None:
    """Check that `dsn` reaches a database holding a store this agl_bridge reads; writes nothing.

    Raises StoreConnectionError (server unreachable, login refused, no such database), NoStoreError
    (no store in that database) or StoreSchemaError (another schema version, or other tables only).
    """
    where = describe_dsn(dsn)
    conn = connect_read_only(dsn, where=where)
    try:
        check_store_tables(conn, where)
    finally:
        conn.close()
