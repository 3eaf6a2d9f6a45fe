"""A throwaway PostgreSQL server from the machine's own binaries, for tests and benchmarks.

`start_postgres()` runs `initdb` and `pg_ctl start` (found with `pg_config --bindir`, or under
/usr/lib/postgresql/*/bin) in a fresh temporary folder on a free loopback port, trusting local
connections; `PostgresServer.stop()` stops it by the postmaster's PID and removes the folder.
PostgreSQL refuses to run as root, so as root the server runs as the `postgres` user (through
`runuser`) in a folder that user owns. `PostgresUnavailable` says why no server could be started
(no binaries, no `postgres` user, initdb failed): tests skip with that reason.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["PostgresServer", "PostgresUnavailable", "postgres_bindir", "start_postgres"]

_SERVER_USER = "postgres"


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server can be started here; the message says why and what to install."""


def postgres_bindir() -> Path | None:
    """The folder of PostgreSQL's server binaries (`initdb`, `pg_ctl`), or None."""
    candidates: list[str] = []
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        done = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        if done.returncode == 0:
            candidates.append(done.stdout.strip())
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for folder in candidates:
        if (Path(folder) / "initdb").is_file() and (Path(folder) / "pg_ctl").is_file():
            return Path(folder)
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class PostgresServer:
    """A running throwaway server: connect with `dsn()`; `stop()` ends it and removes its files."""

    bindir: Path
    root: Path
    port: int
    as_user: list[str] = field(default_factory=list)  # the `runuser -u postgres --` prefix as root
    pid: int | None = None

    @property
    def data_dir(self) -> Path:
        """The cluster's data folder."""
        return self.root / "data"

    def dsn(self, dbname: str = "postgres") -> str:
        """A libpq URL to database `dbname` as the superuser `postgres` (trusted: no password)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, name: str) -> str:
        """Create database `name` and return its URL."""
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def create_schema(self, name: str) -> str:
        """Create schema `name` in the `postgres` database and return a URL whose tables live there.

        Much cheaper than a database (no files copied), so each test gets an empty store of its own.
        """
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{name}"')
        return f"{self.dsn()}?options=-csearch_path%3D{name}"

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.as_user, *args], capture_output=True, text=True, check=False)

    def start(self) -> None:
        """Start the server on its data folder (again, after `stop(keep_files=True)`) and wait until it accepts."""
        done = self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.data_dir),
            "-l",
            str(self.root / "server.log"),
            "-w",
            "-t",
            "60",
            "-o",
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c max_connections=200",
            "start",
        )
        if done.returncode != 0:
            log = (self.root / "server.log").read_text(errors="replace")[-2000:] if self.root.exists() else ""
            raise PostgresUnavailable(f"pg_ctl start failed: {done.stderr.strip() or done.stdout.strip()}\n{log}")
        self.pid = int((self.data_dir / "postmaster.pid").read_text().split()[0])

    def stop(self, *, keep_files: bool = False) -> None:
        """Stop the server by its PID and remove its folder.

        keep_files: a fast shutdown (clients disconnected, data checkpointed) that `start()` can
        follow; otherwise an immediate one, since the files go anyway.
        """
        pid, self.pid = self.pid, None
        if pid is not None:
            try:
                os.kill(pid, signal.SIGINT if keep_files else signal.SIGQUIT)
            except ProcessLookupError:
                pass
            else:
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and _alive(pid):
                    time.sleep(0.05)
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)
        if not keep_files:
            shutil.rmtree(self.root, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A stopped child of ours would linger as a zombie; the postmaster is pg_ctl's, not ours.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def start_postgres() -> PostgresServer:
    """Initialise and start a server in a new temporary folder; PostgresUnavailable says why it cannot."""
    bindir = postgres_bindir()
    if bindir is None:
        raise PostgresUnavailable(
            "no PostgreSQL server binaries (initdb, pg_ctl) found: `pg_config --bindir` and /usr/lib/postgresql/*/bin "
            "have none; install them (Debian: apt-get install -y postgresql)"
        )
    as_user: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="agl-pg-"))
    if os.geteuid() == 0:
        runuser = shutil.which("runuser")
        try:
            import pwd

            entry = pwd.getpwnam(_SERVER_USER)
        except KeyError:
            entry = None
        if runuser is None or entry is None:
            shutil.rmtree(root, ignore_errors=True)
            raise PostgresUnavailable(
                "PostgreSQL refuses to run as root and there is no `postgres` user (or no runuser) to run it as"
            )
        os.chown(root, entry.pw_uid, entry.pw_gid)
        as_user = [runuser, "-u", _SERVER_USER, "--"]
    server = PostgresServer(bindir=bindir, root=root, port=_free_port(), as_user=as_user)
    done = server._run(
        str(bindir / "initdb"), "-D", str(server.data_dir), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"
    )
    if done.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        raise PostgresUnavailable(f"initdb failed: {done.stderr.strip() or done.stdout.strip()}")
    try:
        server.start()
    except BaseException:
        server.stop()
        raise
    return server
