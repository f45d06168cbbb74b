"""Child Python processes for lease tests: started with devpool importable, read line by line."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

import devpool

SRC = str(Path(devpool.__file__).resolve().parent.parent)


def read_line(proc: subprocess.Popen[str], timeout: float = 10.0) -> str:
    """The child's next line of output, failing the test if none comes in time."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "child printed nothing in time"
    return proc.stdout.readline().strip()


def spawn(
    procs: list[subprocess.Popen[str]],
    args: list[str],
    pass_fds: tuple[int, ...] = (),
    stdin: bool = False,
) -> subprocess.Popen[str]:
    """`python ARGS` with devpool on its path; kept in procs so the test ends it."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(
        [sys.executable, *args],
        stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        pass_fds=pass_fds,
    )
    procs.append(proc)
    return proc
