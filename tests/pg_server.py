"""A throwaway PostgreSQL server for the tests of the queue and of the fleet history (the
`postgres` fixture, tests/conftest.py): its own folder, 127.0.0.1, a free port.

initdb refuses root, so as root the server runs as the unprivileged `postgres` user. Only
the server started here is stopped (pg_ctl stop on its own data folder)."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


def server_bin() -> Path | None:
    """The folder of PostgreSQL's server binaries (initdb, pg_ctl), newest first; None."""
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        return Path(on_path).parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), reverse=True)
    return Path(found[0]).parent if found else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    bin: Path
    data: Path
    port: int
    user: str | None  # the unprivileged user it runs as when we are root

    @property
    def url(self) -> str:
        return f"postgresql://devpool@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args), check=check, capture_output=True, text=True, user=self.user, timeout=120
        )

    def start(self) -> None:
        log = self.data.parent / "server.log"
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.data.parent}"
        self._run(str(self.bin / "pg_ctl"), "start", "-w", "-D", str(self.data),
                  "-l", str(log), "-o", options)  # fmt: skip

    def stop(self) -> None:
        self._run(str(self.bin / "pg_ctl"), "stop", "-m", "fast", "-w", "-D", str(self.data),
                  check=False)  # fmt: skip


def start_server() -> Server:
    """initdb in a fresh folder, then start it; the caller stops it."""
    binaries = server_bin()
    assert binaries is not None
    user = None
    top = Path(tempfile.mkdtemp(prefix="devpool-pg-"))
    if os.geteuid() == 0:
        user = "postgres"
        entry = pwd.getpwnam(user)
        os.chown(top, entry.pw_uid, entry.pw_gid)
    top.chmod(0o700)
    server = Server(binaries, top / "data", free_port(), user)
    server._run(str(binaries / "initdb"), "-D", str(server.data), "-U", "devpool",
                "-A", "trust", "--no-sync", "-E", "UTF8")  # fmt: skip
    with open(server.data / "postgresql.conf", "a", encoding="utf-8") as conf:
        conf.write("fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n")
    server.start()
    return server


def remove(server: Server) -> None:
    shutil.rmtree(server.data.parent, ignore_errors=True)
