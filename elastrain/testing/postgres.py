"""A private PostgreSQL for tests: Debian's `initdb` + `pg_ctl` on a free port and a temp socket dir.

Nothing is installed here (`make` installs the tools); without them `Postgres()` raises `ToolMissing`,
which a fixture turns into a skip with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from elastrain.testing.ports import free_port


class ToolMissing(RuntimeError):
    """A tool the harness needs is not on this machine; the message says which and how to get it."""


class Postgres:
    """A PostgreSQL server of its own (trust auth on 127.0.0.1), stopped and removed by `stop()`."""

    def __init__(self) -> None:
        self.bindir = pg_bindir()
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user and not _has_user("postgres"):
            raise ToolMissing("running as root and there is no 'postgres' user for initdb")
        self.root = Path(tempfile.mkdtemp(prefix="elastrain-pg-"))
        self.port = free_port()
        self._dbs = 0
        if self.as_user:
            shutil.chown(self.root, "postgres")
        data = self.root / "data"
        self._run("initdb", "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")
        opts = f"-k {self.root} -p {self.port} -c listen_addresses=127.0.0.1 -F"
        self._run(
            "pg_ctl", "-D", str(data), "-o", opts, "-l", str(self.root / "log"), "-w", "-t", "60", "start"
        )

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run(
            [*self.as_user, str(self.bindir / tool), *args], check=True, capture_output=True, timeout=120
        )

    def new_database(self) -> str:
        """Create a fresh database; returns its URL."""
        import psycopg

        self._dbs += 1
        name = f"elastrain_{self._dbs}"
        with psycopg.connect(
            f"postgresql://postgres@127.0.0.1:{self.port}/postgres", autocommit=True
        ) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        """Stop the server (immediate) and remove its files."""
        try:
            self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def _has_user(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def pg_bindir() -> Path:
    """The directory of `initdb` and `pg_ctl` (PATH, then /usr/lib/postgresql/*/bin); `ToolMissing`."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).parent
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if candidates:
        return candidates[-1].parent
    raise ToolMissing("PostgreSQL (initdb, pg_ctl) is not installed (Debian: apt-get install postgresql)")
