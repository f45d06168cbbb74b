"""The controller's terminal, lent to the one worker whose test is at a debugger prompt.

A worker whose test enters pytest's debugger asks for it (`debugger`, worker/terminal.py)
and waits. The controller lends it its own stdin, stdout and stderr (paths under /proc,
which the worker opens itself): the prompt reads what the user types, or the pipe or
/dev/null a CI job gave the run, as plain pytest's would. While it is lent:

- everything the controller would write to the terminal (reports, devpool's lines, the
  live status) is held, and written when the terminal comes back; nothing is lost;
- Ctrl-C, which the terminal sends to the controller's process group, goes to the worker,
  where pdb shows `--KeyboardInterrupt--` as in plain pytest;
- the test's deadline stops (Attempt.pause), as pytest-timeout's does under a debugger.

Tests of other workers that reach a debugger meanwhile wait their turn, in order; so do the
ranks of a ranks(n) test (backends/merge.py), whose grant (`Lend`) names the one process it
is for.
"""

from __future__ import annotations

import io
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import pytest

from devpool.run import clock
from devpool.run.pool import Slot
from devpool.worker import protocol
from devpool.worker.terminal import real_fds

_STREAMS = ((0, "stdin"), (1, "stdout"), (2, "stderr"))


class TerminalLoan:
    """Who holds the controller's terminal, who waits for it, and what was held meanwhile."""

    def __init__(self, config: pytest.Config, local: bool) -> None:
        self.config = config
        # A worker on another host cannot open this process's files: it keeps its own.
        self.paths = own_streams(config) if local else {}
        self.holder: Slot | None = None
        self.waiting: list[tuple[Slot, int]] = []  # (worker, the process at its prompt)
        self.live: Any = None  # the live status line, paused while the terminal is lent
        self._file: Any = None  # the terminal writer's file, while a buffer stands in
        self._held = io.StringIO()
        self._sigint: Any = None

    @property
    def lent(self) -> bool:
        return self.holder is not None

    def stdin_for(self, parallel: int, jobs: int, say: Callable[[str], None]) -> str | None:
        """-s: the stdin a test's input() reads, as in plain pytest, when one test runs at a
        time; several cannot share one stdin, and on a terminal that is said once."""
        if self.config.getoption("capture", None) != "no":
            return None
        stdin = self.paths.get("stdin")
        if parallel == 1 or jobs <= 1:
            return stdin
        if stdin is not None and os.isatty(0):
            say(
                f"-s: input() in a test reads no terminal input here: up to {parallel} "
                "tests run at once and cannot share one stdin (--devpool-max-parallel=1 "
                "lets one test at a time read it)"
            )
        return None

    def asked(self, slot: Slot, pid: int, post_mortem: bool = False) -> None:
        """A test of this worker (process pid: one rank of a ranks(n) test's) is entering the
        debugger: its turn now, or after others. post_mortem (--pdb): its failure is shown
        there, so pytest's summary leaves it out."""
        attempt = slot.current
        if attempt is not None:
            attempt.pause(clock.now())
            if post_mortem and attempt.phases:
                attempt.phases[-1]._pdbshown = True  # type: ignore[attr-defined]
        if self.holder is None:
            self._lend(slot, pid)
        elif slot is not self.holder and all(slot is not s for s, _ in self.waiting):
            self.waiting.append((slot, pid))

    def left(self, slot: Slot) -> None:
        """The debugger was left (or its worker is gone): the terminal comes back."""
        attempt = slot.current
        if attempt is not None:
            attempt.resume(clock.now())
        self.waiting = [(s, pid) for s, pid in self.waiting if s is not slot]
        if self.holder is slot:
            self._take_back()
            while self.waiting and self.holder is None:
                self._lend(*self.waiting.pop(0))

    def close(self) -> None:
        """The loop ends: whatever it holds is written, Ctrl-C is the controller's again."""
        self.waiting = []
        if self.holder is not None:
            self._take_back()

    def _lend(self, slot: Slot, pid: int) -> None:
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        if self.live is not None:
            self.live.pause()
        if terminal is not None:
            terminal._tw.flush()  # noqa: SLF001 - what was written so far shows first
            self._file, terminal._tw._file = terminal._tw._file, self._held  # noqa: SLF001
        for stream in (sys.stdout, sys.stderr):
            stream.flush()

        def forward(signum: int, frame: object) -> None:
            try:
                os.kill(pid, signal.SIGINT)
            except OSError:
                return

        if self.paths:  # a process on this host (another's pid means nothing here)
            self._sigint = signal.signal(signal.SIGINT, forward)
        self.holder = slot
        paths = self.paths
        lend = protocol.Lend(
            pid=pid,
            lent=bool(paths),
            stdin=paths.get("stdin"),
            stdout=paths.get("stdout"),
            stderr=paths.get("stderr"),
        )
        if not slot.worker.send(lend):
            self._take_back()  # the worker is gone: its exit is handled as usual

    def _take_back(self) -> None:
        self.holder = None
        if self._sigint is not None:
            signal.signal(signal.SIGINT, self._sigint)
            self._sigint = None
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        if terminal is not None and self._file is not None:
            terminal._tw._file = self._file  # noqa: SLF001
            self._file = None
            held, self._held = self._held.getvalue(), io.StringIO()
            terminal._tw._file.write(held)  # noqa: SLF001
            terminal._tw.flush()  # noqa: SLF001
        if self.live is not None:
            self.live.resume()


def own_streams(config: pytest.Config) -> dict[str, str | None]:
    """Paths a worker on this host opens to reach this process's own stdin, stdout and
    stderr (those under pytest's capture, if it captures); None for one that is closed."""
    paths: dict[str, str | None] = {}
    real = real_fds(config)
    for fd, name in _STREAMS:
        try:
            os.fstat(real[fd])
        except OSError:
            paths[name] = None
            continue
        paths[name] = f"/proc/{os.getpid()}/fd/{real[fd]}"
    return paths
