"""`devpool run --log FILE`: the terminal's text, copied to FILE as it is printed.

A pipe to `tee` hands the step tee's exit status unless the shell has `set -o pipefail`;
copying here keeps the exit status `devpool run`'s own, which is pytest's.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, BinaryIO, TextIO

from devpool.errors import DevpoolError

_CHUNK = 65536


class OutputLog:
    """One file that receives everything the child and `devpool run` print, in arrival order."""

    def __init__(self, path: Path) -> None:
        try:
            self._file: BinaryIO = open(path, "wb")  # noqa: SIM115 - closed by close()
        except OSError as exc:
            raise DevpoolError(
                f"devpool run --log={path}: cannot write it: {exc.strerror}"
            ) from None
        self.path = path
        self._lock = threading.Lock()
        self._pumps: list[threading.Thread] = []

    def follow(self, child: subprocess.Popen[bytes]) -> None:
        """Copy the child's stdout and stderr to ours and to the file until it closes them."""
        assert child.stdout is not None and child.stderr is not None
        for source, terminal in ((child.stdout, sys.stdout), (child.stderr, sys.stderr)):
            pump = threading.Thread(target=self._pump, args=(source, terminal), daemon=True)
            pump.start()
            self._pumps.append(pump)

    def say(self, text: str) -> None:
        """A line of devpool run's own, on stderr and in the file."""
        self._copy(text.encode(), sys.stderr)

    def close_pipes(self, bound: float = 30.0) -> None:
        """Wait for the child's last bytes: its pipes close when it and its workers end. A
        process it left behind that holds them is not waited for past `bound` seconds."""
        for pump in self._pumps:
            pump.join(bound)
        self._pumps = []

    def close(self) -> None:
        self.close_pipes()
        with self._lock:
            self._file.close()

    def _pump(self, source: IO[bytes], terminal: TextIO) -> None:
        fd = source.fileno()
        while True:
            data = os.read(fd, _CHUNK)
            if not data:
                break
            self._copy(data, terminal)
        source.close()

    def _copy(self, data: bytes, terminal: TextIO) -> None:
        with self._lock:
            terminal.flush()
            try:
                terminal.buffer.write(data)
                terminal.buffer.flush()
            except (BrokenPipeError, ValueError):
                pass  # the reader of our terminal left; the file still gets every byte
            if not self._file.closed:
                self._file.write(data)
                self._file.flush()


def say(text: str, log: OutputLog | None) -> None:
    """One line of devpool run's own (with its newline) on stderr, and in the log if any."""
    if log is not None:
        log.say(text + "\n")
    else:
        print(text, file=sys.stderr)


def pipe_warning() -> str | None:
    """Under GitHub Actions with stdout a pipe: one line saying what the step's status is."""
    if os.environ.get("GITHUB_ACTIONS") != "true":
        return None
    try:
        piped = stat.S_ISFIFO(os.fstat(sys.stdout.fileno()).st_mode)
    except (OSError, ValueError):
        return None
    if not piped:
        return None
    return (
        "devpool run: stdout is a pipe: the step's status is this exit code only under "
        "`set -o pipefail` (`shell: bash` has it); `devpool run --log FILE` needs no pipe"
    )
