"""A fresh worker or template process: `python -m pytest ... --devpool-worker SPEC`.

Shared by the local backend and the Ray node actors, which import no pytest themselves.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path


def pytest_process(
    args: Sequence[str],
    spec: str,
    cwd: str | Path,
    env: Mapping[str, str],
    log: str | Path,
    fds: tuple[int, ...],
    append: bool = False,
) -> subprocess.Popen[bytes]:
    """A process of its own session, its output in log (after what log holds, with
    append), inheriting fds (a worker's pipes and leases, a template's socket)."""
    argv = [sys.executable, "-m", "pytest", *args, "--devpool-worker", spec]
    with open(log, "ab" if append else "wb") as out:
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            pass_fds=fds,
            start_new_session=True,
        )
