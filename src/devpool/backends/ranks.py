"""A `ranks(n)` test on this host: n worker processes, one per rank, that the loop sees as one.

Every rank is an ordinary local worker (forked from its kind's template, else a fresh
interpreter) with torchrun's environment. Their event streams meet in the rank merge
(backends/merge.py), whose one stream the group writes into a pipe of its own: the loop
reads a group as it reads any worker. The group delivers the signals its fail-fast rules
(backends/failfast.py) order when one rank's ending dooms the others: a failure, a lone
skip, a death.

A group whose test passed on every rank stays together, with its devices and MASTER_PORT,
for the next job of the same shape (warm reuse, as for any worker).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devpool.backends import WorkerHandle
from devpool.backends.failfast import FailFast
from devpool.devices.leases import Lease
from devpool.worker import protocol, wire
from devpool.worker.stacks import stacks_file

# A line of a worker's pytest progress: `test_x.py ..F` or its letters, and a percentage.
_PROGRESS = re.compile(r"(\S+\.py ?)?[.sSfFEexXR]*( *\[ *\d+%\])? *")


@dataclass(eq=False)
class Rank:
    """One rank of a group: its worker, and what became of it."""

    rank: int
    worker: Any  # backends/local.py's Worker
    gone: bool = False  # its pipe closed or its process ended: it says nothing more
    mark: int = 0  # its log's size when the current test started


@dataclass(eq=False)
class RankGroup(WorkerHandle):
    """A ranks(n) test's n workers, seen by the loop as one worker."""

    key: int
    devices: tuple[int, ...]
    lease: Lease | None
    ranks: list[Rank]
    log: Path  # rank 0's log: the loop's offsets; every rank's output is in rank_output
    fd_out: int
    write_end: int
    shape: int
    reader: wire.Reader = field(default_factory=wire.Reader)
    fate: FailFast = field(init=False)
    exited: bool = False
    unwritten: bytearray = field(default_factory=bytearray)

    straggle: float = 60.0  # --devpool-rank-straggle

    def __post_init__(self) -> None:
        self.fate = FailFast(len(self.ranks), self.straggle)

    @property
    def pid(self) -> int:
        return int(self.ranks[0].worker.pid)

    @property
    def spent(self) -> bool:
        """It takes no more work: a rank's ending ended the group."""
        return self.fate.fallen is not None

    @property
    def ended_by(self) -> str | None:
        """Which rank died under the test, and how (the loop's crash detail)."""
        return self.fate.ended_by

    @property
    def stacks(self) -> Path:
        """Every rank's stacks (faulthandler, at a timeout), each labelled, in one file."""
        combined = self.log.with_name(f"{self.log.stem}.ranks.stacks")
        logs = [(rank.rank, rank.worker.pid, rank.worker.log) for rank in self.ranks]
        combined.write_text(labelled_stacks(self.fate, logs), encoding="utf-8")
        return combined

    @property
    def rank_info(self) -> list[dict[str, Any]]:
        return [
            {
                "rank": rank.rank,
                "pid": rank.worker.pid,
                "devices": list(rank.worker.devices),
                "outcome": self.fate.outcomes[rank.rank],
                "log": str(rank.worker.log),
            }
            for rank in self.ranks
        ]

    # ---- the loop's side ------------------------------------------------------------------

    def send(self, message: protocol.Message) -> bool:
        """Send a command to every rank; False once the group is spent or gone."""
        if isinstance(message, protocol.Stop):
            self.fate.stopping = True
        elif self.fate.fallen is not None and isinstance(message, (protocol.Run, protocol.More)):
            return False
        sent = False
        for rank in self.ranks:
            if not rank.gone and rank.worker.send(message):
                sent = True
        return sent

    def signal_group(self, signum: int) -> None:
        if signum in (signal.SIGTERM, signal.SIGKILL):
            self.fate.signalled = True
        for rank in self.ranks:
            rank.worker.signal_group(signum)

    def dump_stacks(self) -> None:
        """Ask every rank's faulthandler for its stacks."""
        for rank in self.ranks:
            if rank.worker.pid > 0:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(rank.worker.pid, signal.SIGUSR1)

    def poll(self) -> int | None:
        codes = [rank.worker.poll() for rank in self.ranks]
        if any(code is None for code in codes):
            return None
        return self._code(codes)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        codes = []
        for rank in self.ranks:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            codes.append(rank.worker.wait(timeout=left))
        return self._code(codes)

    def _code(self, codes: Sequence[int | None]) -> int:
        culprit = self.fate.culprit
        if culprit is not None and codes[culprit]:
            return int(codes[culprit] or 0)
        return next((int(c) for c in codes if c), 0)

    def close(self) -> None:
        for rank in self.ranks:
            rank.worker.close()
        for fd in (self.fd_out, self.write_end):
            with contextlib.suppress(OSError):
                os.close(fd)

    def reached(self, nodeid: str) -> set[str]:
        """The phases of a test some rank reported ("call": its body ran, so a crash there is
        no setup error)."""
        return {p for rank in self.ranks for p in self.fate.merge.phases(nodeid, rank.rank)}

    def rank_output(self) -> str:
        """What each rank wrote to its log since the current test started, labelled; not its
        pytest's progress (the file name, the letters), which is no output of the test."""
        parts = []
        for rank in self.ranks:
            try:
                with open(rank.worker.log, "rb") as log:
                    log.seek(rank.mark)
                    every = log.read().decode("utf-8", "replace").splitlines()
            except OSError:
                continue
            lines = [line for line in every if not (line.strip() and _PROGRESS.fullmatch(line))]
            lines = lines[-40:]
            if any(line.strip() for line in lines):
                parts.append(f"---- [rank {rank.rank}] output during this test (tail) ----")
                parts.extend(lines)
        return "\n".join(parts)

    # ---- the ranks' events ----------------------------------------------------------------

    def pump(self, rank: Rank, read: Callable[[int], tuple[bytes, bool]]) -> None:
        """A rank's pipe is readable: its events through the merge, into the group's pipe."""
        if rank.gone:
            return
        data, eof = read(rank.worker.fd_out)
        now = time.monotonic()
        out: list[protocol.Message] = []
        messages = rank.worker.reader.feed(data)
        if eof:
            messages += rank.worker.reader.ended()
        for message in messages:
            out += self.fate.take(rank.rank, message, now)
        if eof:
            out += self._rank_gone(rank, now)
        self._emit(out)

    def _rank_gone(self, rank: Rank, now: float) -> list[protocol.Message]:
        rank.gone = True
        code = _code_soon(rank.worker) if not self.fate.stopping else rank.worker.poll()
        stacks = ""
        if rank.rank in self.fate.straggling:
            with contextlib.suppress(OSError):
                stacks = stacks_file(rank.worker.log).read_text(encoding="utf-8", errors="replace")
        return self.fate.rank_gone(rank.rank, code, rank.worker.pid, now, stacks.strip())

    # ---- time ----------------------------------------------------------------------------

    def check(self, now: float, read: Callable[[int], tuple[bytes, bool]]) -> None:
        """Ranks that ended without closing their pipe, the skip window, the SIGKILLs."""
        for rank in self.ranks:
            if not rank.gone and rank.worker.poll() is not None:
                self.pump(rank, read)
                if not rank.gone:  # a child of the test keeps its pipe open
                    self._emit(self._rank_gone(rank, now))
        self.fate.tick(now)
        self._emit([])

    def due(self) -> list[float]:
        times = self.fate.due()
        if self.unwritten:
            times.append(time.monotonic())
        return times

    def _emit(self, messages: list[protocol.Message]) -> None:
        """Into the group's own pipe (non-blocking; what does not fit waits for check), after
        the signals the fate ordered."""
        for rank, signum in self.fate.take_orders():
            self.ranks[rank].worker.signal_group(signum)
        for message in messages:
            if isinstance(message, protocol.Start):
                for each in self.ranks:
                    each.mark = _size(each.worker.log)
            self.unwritten += protocol.encode(message)
        while self.unwritten:
            try:
                written = os.write(self.write_end, self.unwritten)
            except (BlockingIOError, OSError):
                return
            del self.unwritten[:written]
        if all(rank.gone for rank in self.ranks) and self.write_end >= 0:
            os.close(self.write_end)  # the loop reads the end of the group
            self.write_end = -1


def labelled_stacks(fate: FailFast, logs: Sequence[tuple[int, int, Path]]) -> str:
    """Every rank's faulthandler stacks, labelled; ranks that had finished the current test
    say so instead, and the ranks still in it come last (their lines end a summary's tail)."""
    current = fate.merge.current
    through = fate.merge.finished.get(current, set()) if current else set()
    parts = [
        f"---- [rank {rank}] pid {pid}: had finished the test, waiting for the other ranks ----"
        for rank, pid, _ in logs
        if rank in through
    ]
    for rank, pid, log in logs:
        if rank in through:
            continue
        try:
            text = stacks_file(log).read_text(encoding="utf-8", errors="replace")
        except OSError:
            text = ""
        body = text.strip() or "(this rank wrote no stacks)"
        parts.append(f"---- [rank {rank}] pid {pid} ----\n{body}")
    return "\n".join(parts) + "\n"


def group_pipe() -> tuple[int, int]:
    """The group's own event pipe: (read end, write end), both non-blocking."""
    read_end, write_end = os.pipe()
    for fd in (read_end, write_end):
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
    with contextlib.suppress(OSError):  # Linux: room for a long report in one piece
        fcntl.fcntl(write_end, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    return read_end, write_end


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _code_soon(worker: Any) -> int | None:
    """The exit status of a rank whose pipe just closed (it is ending, or has)."""
    try:
        return int(worker.wait(timeout=1.0))
    except subprocess.TimeoutExpired:
        return None
