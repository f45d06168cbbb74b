"""What one rank's ending does to the others: the fail-fast rules of a multi-rank test.

The same rules for `ranks(n)` on a host (backends/ranks.py, signals to local process groups)
and for multi-rank tests on Ray (ray/backend.py, signals through the rank actors). This
module decides and keeps no process: its owner feeds it each rank's events and endings,
then delivers the signals it orders.

- A rank fails or errors a phase: every other rank gets SIGTERM now and SIGKILL after
  RANK_GRACE; their part of the test reads "ended: rank N failed" (backends/merge.py).
- A rank skips while the others run on past SKIP_WAIT: the same, as "rank N skipped".
- A rank dies on its own: the same, and no report of its test goes out, so the loop ends
  that test `crashed` with `ended_by` ("rank 1 (pid 42) exited with code 7").
- Ranks still in a test `straggle` seconds after another rank finished it (a collective
  the others skipped, a barrier nobody else reaches): their stacks are dumped (SIGUSR1),
  then they are ended as above, as "ranks 0 still in the test 60 s after rank 1 finished
  it" (--devpool-rank-straggle).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

from devpool.backends.merge import ENDED, Merge, ranks_named
from devpool.wording import describe_exit
from devpool.worker import protocol

RANK_GRACE = 1.0  # seconds from SIGTERM to SIGKILL for ranks ended by another rank's ending
SKIP_WAIT = 2.0  # seconds the other ranks have to skip too, once one rank skipped
KILL_RETRY = 1.0
STACKS_WAIT = 0.5  # seconds for faulthandler to write a straggling rank's stacks


@dataclass
class FailFast:
    """One multi-rank worker's merge and fate: which ranks to signal, and what to report."""

    world: int
    straggle: float = 60.0  # seconds ranks may stay in a test another rank has finished
    merge: Merge = field(init=False)
    outcomes: list[str] = field(init=False)  # each rank's part in the current test
    gone: set[int] = field(default_factory=set)
    stopping: bool = False  # told to stop: ranks that end now end as asked
    signalled: bool = False  # devpool ends the whole worker (timeout, overrun, shutdown)
    fallen: str | None = None  # "rank 1 failed": what ended the worker
    fallen_test: str | None = None  # the test whose ending still goes out
    culprit: int | None = None
    ended_by: str | None = None  # a rank died under a test: the loop's crash detail
    kill_at: float | None = None
    skip: tuple[float, int, str, str] | None = None  # (by, rank, nodeid, phase)
    lag: tuple[float, str] | None = None  # (by, nodeid): a rank finished it, others have not
    straggling: set[int] = field(default_factory=set)  # ranks ended for never finishing it
    term_at: float | None = None  # SIGTERM to the stragglers, once their stacks are written
    orders: list[tuple[int, int]] = field(default_factory=list)  # (rank, signal) to deliver

    def __post_init__(self) -> None:
        self.merge = Merge(self.world)
        self.outcomes = [""] * self.world

    def take(self, rank: int, message: protocol.Message, now: float) -> list[protocol.Message]:
        """One event of a rank: what goes out of the merge (nothing of a fallen worker's
        later tests)."""
        if self.fallen is not None:
            if isinstance(message, protocol.Report):
                nodeid = message.data.get("nodeid")
            elif isinstance(message, protocol.Finish):
                nodeid = message.nodeid
            else:
                return []
            if nodeid != self.fallen_test:
                return []
        if isinstance(message, protocol.Report):
            data = message.data
            outcome = str(data.get("outcome", ""))
            if self.outcomes[rank] != "failed" and (outcome != "passed" or not self.outcomes[rank]):
                self.outcomes[rank] = outcome  # a test's worst phase is the rank's part
            when = str(data.get("when", ""))
            if outcome == "failed" and self.fallen is None:
                self._fall(rank, "errored" if when != "call" else "failed", data["nodeid"], now)
            elif outcome == "skipped" and self.skip is None and self.fallen is None:
                self.skip = (now + SKIP_WAIT, rank, str(data["nodeid"]), when)
        out = self.merge.feed(rank, message)
        if isinstance(message, protocol.DebuggerLeft) and not self.merge.prompts:
            # The windows for the other ranks stopped at the prompt: they start again.
            if self.skip is not None:
                self.skip = (now + SKIP_WAIT, *self.skip[1:])
            if self.lag is not None:
                self.lag = (now + self.straggle, self.lag[1])
        if not isinstance(message, protocol.Finish):
            return self._seen(out)
        if self.lag is None and self.fallen is None and not out:
            self.lag = (now + self.straggle, message.nodeid)  # others still in it
        if self.fallen is not None and rank == self.culprit:
            self.orders.append((rank, signal.SIGTERM))  # its teardown ran: nothing more wanted
        return self._seen(out)

    def rank_gone(
        self, rank: int, code: int | None, pid: int, now: float, stacks: str = ""
    ) -> list[protocol.Message]:
        """A rank's process ended (code: its exit status, None if unknown; stacks: what its
        faulthandler wrote, shown when it straggled)."""
        if rank in self.gone:
            return []
        self.gone.add(rank)
        if self.fallen is None and not self.stopping and not self.signalled:
            # It died on its own: the test it was in crashed, and the worker with it.
            how = describe_exit(code)
            self.outcomes[rank] = "crashed"
            self.ended_by = f"rank {rank} (pid {pid}) {how}"
            self._fall(rank, how, None, now)
            return []
        if self.signalled and rank in self.merge.where:
            self.outcomes[rank] = "killed"  # inside the test when devpool ended the worker
        if self.fallen is not None and self.fallen_test is not None:
            if rank != self.culprit:
                self.outcomes[rank] = "ended"
            why = f"{ENDED}{self.fallen}"
            if rank in self.straggling:
                why += "\n---- its stacks (faulthandler) ----\n" + (stacks or "(none written)")
            return self._seen(self.merge.end_rank(rank, why))
        return []

    def tick(self, now: float) -> None:
        """The skip window and the SIGKILLs, when due; no rank is a straggler while one sits
        at a debugger's prompt."""
        judging = self.fallen is None and not self.merge.prompts
        if self.skip is not None and now >= self.skip[0] and judging:
            _, who, nodeid, when = self.skip
            behind = [
                r
                for r in range(self.world)
                if r not in self.gone and when not in self.merge.phases(nodeid, r)
            ]
            if behind:
                self._fall(who, "skipped", nodeid, now)
            self.skip = None
        if self.lag is not None and now >= self.lag[0] and judging:
            self._straggled(self.lag[1], now)
        if self.term_at is not None and now >= self.term_at:
            self.term_at = None
            self.orders += [(r, signal.SIGTERM) for r in self.straggling if r not in self.gone]
            self.kill_at = now + RANK_GRACE
        if self.kill_at is not None and now >= self.kill_at:
            self.kill_at = now + KILL_RETRY
            self.orders += [(r, signal.SIGKILL) for r in range(self.world) if r not in self.gone]

    def due(self) -> list[float]:
        skip, lag = self.skip[0] if self.skip else None, self.lag[0] if self.lag else None
        if self.merge.prompts:
            skip = lag = None
        return [t for t in (self.kill_at, skip, lag, self.term_at) if t is not None]

    def take_orders(self) -> list[tuple[int, int]]:
        orders, self.orders = self.orders, []
        return orders

    def _seen(self, out: list[protocol.Message]) -> list[protocol.Message]:
        for message in out:
            if isinstance(message, protocol.Start):
                self.outcomes = [""] * self.world
            elif isinstance(message, protocol.Finish):
                self.skip = self.lag = None
        return out

    def _straggled(self, nodeid: str, now: float) -> None:
        """Some ranks never finished a test the others finished: their stacks, then the end."""
        through = self.merge.finished.get(nodeid, set())
        behind = [r for r in range(self.world) if r not in through and r not in self.gone]
        self.lag = None
        if not behind:
            return
        self.fallen = (
            f"{ranks_named(behind)} still in the test {self.straggle:g} s after "
            f"{ranks_named(through)} finished it"
        )
        self.fallen_test, self.culprit = nodeid, None
        self.straggling = set(behind)
        self.orders += [(r, signal.SIGUSR1) for r in behind]  # faulthandler: their stacks
        self.term_at = now + STACKS_WAIT  # then SIGTERM, and SIGKILL after the grace

    def _fall(self, rank: int, how: str, nodeid: str | None, now: float) -> None:
        self.fallen = f"rank {rank} {how}"
        self.fallen_test = nodeid
        self.culprit = rank
        self.orders += [
            (other, signal.SIGTERM)
            for other in range(self.world)
            if other != rank and other not in self.gone
        ]
        self.kill_at = now + RANK_GRACE
