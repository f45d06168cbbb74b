"""A `ranks(n)` test on this host: n worker processes, one per rank, that the loop sees as one.

Every rank is an ordinary local worker (forked from its kind's template, else a fresh
interpreter) with torchrun's environment. Their event streams meet in the rank merge
(backends/merge.py), whose one stream the group writes into a pipe of its own: the loop
reads a group as it reads any worker. The group also ends what one rank's ending dooms:

- a rank that fails or errors a phase: the other ranks get SIGTERM to their process groups
  at once and SIGKILL after RANK_GRACE; their part reads "ended: rank N failed";
- a rank that dies: the same, and the test is `crashed`, naming the rank and its exit;
- a rank that skips while the others run on past SKIP_WAIT: as a failure (merge.py says why).

A group whose test passed on every rank stays together, with its devices and MASTER_PORT,
for the next job of the same shape (warm reuse, as for any worker).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devpool.backends.merge import ENDED, Merge
from devpool.devices.leases import Lease
from devpool.wording import describe_exit
from devpool.worker import protocol
from devpool.worker.stacks import stacks_file

RANK_GRACE = 1.0  # seconds from SIGTERM to SIGKILL for ranks ended by another rank's ending
SKIP_WAIT = 2.0  # seconds the other ranks have to skip too, once one rank skipped
KILL_RETRY = 1.0


def rank_env(rank: int, world: int, devices: Sequence[int], per_rank: int) -> dict[str, str]:
    """torchrun's variables for one rank on this host (MASTER_ADDR and MASTER_PORT come with
    the group's leased port), and the rank's own devices for the devpool_rank fixture."""
    own = devices[rank * per_rank : (rank + 1) * per_rank]
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "GROUP_RANK": "0",
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world),
        "DEVPOOL_RANK_DEVICES": ",".join(str(d) for d in own),
    }


@dataclass(eq=False)
class Rank:
    """One rank of a group: its worker, and what became of it."""

    rank: int
    worker: Any  # backends/local.py's Worker
    gone: bool = False  # its pipe closed or its process ended: it says nothing more
    outcome: str = ""  # of its part in the last test: passed, failed, skipped, ended, crashed
    mark: int = 0  # its log's size when the current test started

    def describe(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "pid": self.worker.pid,
            "devices": list(self.worker.devices),
            "outcome": self.outcome,
            "log": str(self.worker.log),
        }


@dataclass(eq=False)
class RankGroup:
    """A ranks(n) test's n workers, seen by the loop as one worker."""

    key: int
    devices: tuple[int, ...]
    lease: Lease | None
    ranks: list[Rank]
    log: Path  # rank 0's log: the loop's offsets; every rank's output is in rank_output
    fd_out: int
    write_end: int
    shape: int
    reader: protocol.Reader = field(default_factory=protocol.Reader)
    merge: Merge = field(init=False)
    exited: bool = False
    outbox: bytearray = field(default_factory=bytearray)
    stopping: bool = False  # told to stop: ranks that end now end as asked
    signalled: bool = False  # devpool signals the whole group (timeout, overrun, shutdown)
    fallen: str | None = None  # "rank 1 failed": what ended the group
    fallen_test: str | None = None
    culprit: int | None = None
    ended_by: str | None = None  # a rank died under a test: the loop's crash detail
    kill_at: float | None = None
    skip: tuple[float, int, str, str] | None = None  # (by, rank, nodeid, phase)

    def __post_init__(self) -> None:
        self.merge = Merge(len(self.ranks))

    @property
    def pid(self) -> int:
        return int(self.ranks[0].worker.pid)

    @property
    def spent(self) -> bool:
        """It takes no more work: a rank's ending ended the group."""
        return self.fallen is not None

    @property
    def stacks(self) -> Path:
        """Every rank's stacks (faulthandler, at a timeout), each labelled, in one file."""
        combined = self.log.with_name(f"{self.log.stem}.ranks.stacks")
        current = self.merge.current
        through = self.merge.finished.get(current, set()) if current else set()
        parts = [
            f"---- [rank {rank.rank}] pid {rank.worker.pid}: had finished the test, waiting "
            "for the other ranks ----"
            for rank in self.ranks
            if rank.rank in through
        ]
        # The ranks still in the test last: their lines end the tail a summary shows.
        for rank in self.ranks:
            if rank.rank in through:
                continue
            try:
                text = stacks_file(rank.worker.log).read_text(encoding="utf-8", errors="replace")
            except OSError:
                text = ""
            body = text.strip() or "(this rank wrote no stacks)"
            parts.append(f"---- [rank {rank.rank}] pid {rank.worker.pid} ----\n{body}")
        combined.write_text("\n".join(parts) + "\n", encoding="utf-8")
        return combined

    @property
    def rank_info(self) -> list[dict[str, Any]]:
        return [rank.describe() for rank in self.ranks]

    # ---- the loop's side ------------------------------------------------------------------

    def send(self, message: protocol.Message) -> bool:
        """Send a command to every rank; False once the group is spent or gone."""
        op = message.get("op")
        if op == "stop":
            self.stopping = True
        elif self.fallen is not None and op in ("run", "more"):
            return False
        sent = False
        for rank in self.ranks:
            if not rank.gone and rank.worker.send(message):
                sent = True
        return sent

    def signal_group(self, signum: int) -> None:
        if signum in (signal.SIGTERM, signal.SIGKILL):
            self.signalled = True
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
        if self.culprit is not None and codes[self.culprit]:
            return int(codes[self.culprit] or 0)
        return next((int(c) for c in codes if c), 0)

    def close(self) -> None:
        for rank in self.ranks:
            rank.worker.close()
        for fd in (self.fd_out, self.write_end):
            with contextlib.suppress(OSError):
                os.close(fd)

    def rank_output(self) -> str:
        """What each rank wrote to its log since the current test started, labelled."""
        parts = []
        for rank in self.ranks:
            try:
                with open(rank.worker.log, "rb") as log:
                    log.seek(rank.mark)
                    lines = log.read().decode("utf-8", "replace").splitlines()[-40:]
            except OSError:
                continue
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
        out: list[protocol.Message] = []
        for message in rank.worker.reader.feed(data):
            out += self._take(rank, message)
        if eof:
            out += self._rank_gone(rank)
        self._emit(out)

    def _take(self, rank: Rank, message: protocol.Message) -> list[protocol.Message]:
        event = message.get("ev")
        if self.fallen is not None:
            # Only the ending of the test the group fell in still goes out.
            nodeid = message.get("nodeid") or message.get("data", {}).get("nodeid")
            if event not in ("report", "finish") or nodeid != self.fallen_test:
                return []
        if event == "report":
            data = message["data"]
            outcome = str(data.get("outcome", ""))
            if outcome != "passed" or not rank.outcome:  # a test's worst phase is its part
                rank.outcome = outcome if rank.outcome != "failed" else rank.outcome
            when = str(data.get("when", ""))
            if outcome == "failed" and self.fallen is None:
                self._fall(rank, "errored" if when != "call" else "failed", data["nodeid"])
            elif outcome == "skipped" and self.skip is None and self.fallen is None:
                nodeid = str(data["nodeid"])
                self.skip = (time.monotonic() + SKIP_WAIT, rank.rank, nodeid, when)
        out = self.merge.feed(rank.rank, message)
        if event == "finish" and self.fallen is not None and rank.rank == self.culprit:
            # The failing rank has run its teardown: nothing more of it is wanted.
            rank.worker.signal_group(signal.SIGTERM)
        return self._seen(out)

    def _seen(self, out: list[protocol.Message]) -> list[protocol.Message]:
        for message in out:
            event = message.get("ev")
            if event == "start":
                for rank in self.ranks:
                    rank.mark = _size(rank.worker.log)
                    rank.outcome = ""
            elif event == "finish":
                self.skip = None
        return out

    def _rank_gone(self, rank: Rank) -> list[protocol.Message]:
        rank.gone = True
        if self.fallen is None and not self.stopping and not self.signalled:
            # A rank died on its own: the test it was in crashed, and so does the group.
            code = _code_soon(rank.worker)
            rank.outcome = "crashed"
            how = describe_exit(code)
            self.ended_by = f"rank {rank.rank} (pid {rank.worker.pid}) {how}"
            self._fall(rank, how, None)
            self.fallen_test = None  # no report of that test goes out: it crashed
            return []
        if self.signalled and rank.rank in self.merge.where:
            rank.outcome = "killed"  # inside the test when devpool ended the group
        if self.fallen is not None and self.fallen_test is not None:
            if rank.rank != self.culprit:
                rank.outcome = "ended"
            return self._seen(self.merge.end_rank(rank.rank, f"{ENDED}{self.fallen}"))
        return []

    def _fall(self, rank: Rank, how: str, nodeid: str | None) -> None:
        """One rank's ending dooms the others: end them now, the culprit after its test."""
        self.fallen = f"rank {rank.rank} {how}"
        self.fallen_test = nodeid
        self.culprit = rank.rank
        for other in self.ranks:
            if other is not rank and not other.gone:
                other.worker.signal_group(signal.SIGTERM)
        self.kill_at = time.monotonic() + RANK_GRACE

    # ---- time ----------------------------------------------------------------------------

    def check(self, now: float, read: Callable[[int], tuple[bytes, bool]]) -> None:
        """Ranks that ended without closing their pipe, the skip window, the SIGKILLs."""
        for rank in self.ranks:
            if not rank.gone and rank.worker.poll() is not None:
                self.pump(rank, read)
                if not rank.gone:  # a child of the test keeps its pipe open
                    self._emit(self._rank_gone(rank))
        if self.skip is not None and now >= self.skip[0] and self.fallen is None:
            _, who, nodeid, when = self.skip
            behind = [
                r
                for r in self.ranks
                if not r.gone and when not in self.merge.phases(nodeid, r.rank)
            ]
            if behind:
                self._fall(self.ranks[who], "skipped", nodeid)
            self.skip = None
        if self.kill_at is not None and now >= self.kill_at:
            self.kill_at = now + KILL_RETRY
            for rank in self.ranks:
                if not rank.gone:
                    rank.worker.signal_group(signal.SIGKILL)
        self._emit([])

    def due(self) -> list[float]:
        times = [t for t in (self.kill_at, self.skip[0] if self.skip else None) if t is not None]
        if self.outbox:
            times.append(time.monotonic())
        return times

    def _emit(self, messages: list[protocol.Message]) -> None:
        """Into the group's own pipe (non-blocking; what does not fit waits for check)."""
        for message in messages:
            self.outbox += protocol.encode(message)
        while self.outbox:
            try:
                written = os.write(self.write_end, self.outbox)
            except (BlockingIOError, OSError):
                return
            del self.outbox[:written]
        if all(rank.gone for rank in self.ranks) and self.write_end >= 0:
            os.close(self.write_end)  # the loop reads the end of the group
            self.write_end = -1


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
