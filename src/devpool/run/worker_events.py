"""A worker's events, each to its handler: attempts move, reports go to the replay.

The dispatch loop (loop.py) polls the workers and hands every event here, and every worker
that ended: `handle` routes an event to its `_on_<tag>` handler (one per type of the
protocol's EVENTS, wire.handlers), which moves the attempt it concerns through its states
(attempts.py), tells the replay (replay.py), or ends it through endings.py. A worker done
with its batch goes back to the pool, idle or retired. What it reads of the loop's, it is
given at its construction; the only state of its own is the tests said renamed.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from devpool import compat
from devpool.backends import Backend
from devpool.outcomes import Outcome
from devpool.plan.scheduler import Scheduler
from devpool.run import again, clock
from devpool.run.again import Happened
from devpool.run.attempts import Attempt, State
from devpool.run.context import RunContext
from devpool.run.endings import Endings
from devpool.run.leaks import Leaks
from devpool.run.memory_watch import MemoryWatches
from devpool.run.placing import Placing
from devpool.run.pool import Slot, WorkerPool
from devpool.run.replay import Replay
from devpool.run.terminal import TerminalLoan
from devpool.run.warned import WorkerWarnings
from devpool.worker import protocol, wire


class WorkerEvents:
    """Handles each worker event and each worker's exit (composed by the loop)."""

    def __init__(
        self,
        ctx: RunContext,
        config: pytest.Config,
        scheduler: Scheduler,
        backend: Backend,
        pool: WorkerPool,
        replay: Replay,
        placing: Placing,
        memory: MemoryWatches,
        endings: Endings,
        leaks: Leaks,
        terminal: TerminalLoan,
        warned: WorkerWarnings,
        say: Callable[[str], None],
        check_stop: Callable[[], None],
    ) -> None:
        self.ctx = ctx
        self.config = config
        self.hook = config.hook
        self.scheduler = scheduler
        self.backend = backend
        self.pool = pool
        self.replay = replay
        self.placing = placing
        self.memory = memory
        self.endings = endings
        self.leaks = leaks
        self.terminal = terminal
        self.warned = warned
        self.say = say
        self.check_stop = check_stop  # the loop's: -x / --maxfail reached, dispatch stops
        self.renamed: set[str] = set()  # tests a worker collected under another parametrize id
        # Each worker event's handler, `_on_<tag>`: an event without one stops the run here.
        self.handlers = wire.handlers(self, protocol.EVENTS)

    def handle(self, slot: Slot, event: protocol.Message) -> None:
        """One event of a worker, to its `_on_<tag>` handler (wire.handlers)."""
        handler = self.handlers.get(type(event))
        if handler is None:
            raise protocol.ProtocolError(f"the run loop has no handler for {event!r:.200}")
        handler(slot, event)

    def _on_ready(self, slot: Slot, event: protocol.Ready) -> None:
        slot.ready_by = None
        slot.startup = clock.now() - slot.spawned
        self.ctx.emit(
            "worker_ready",
            worker=slot.key,
            worker_pid=event.pid or slot.worker.pid,
            startup=round(slot.startup, 3),
            devices=list(slot.worker.devices),
        )

    def _on_start(self, slot: Slot, event: protocol.Start) -> None:
        attempt = self._sent(slot, event.nodeid)
        if attempt is None:
            return
        if attempt.job is not slot.head:
            self.placing.job_started(slot, attempt.job, clock.now())
        now = clock.now()
        cost: dict[str, float] = {}
        if slot.startup is not None:  # the first test of a new worker waited for its start
            cost["startup"] = round(slot.startup, 3)
            slot.startup = None
        if slot.leased is not None:  # a lease held from its taking to the first test
            cost["lease_to_start"] = round(now - slot.leased, 3)
            slot.leased = None
        attempt.start(self.ctx.emit, slot.log_size(), **cost)
        self.memory.watch(slot, attempt)
        self.replay.logstart(attempt.display, tuple(event.location))
        self.placing.stream(slot)

    def _on_report(self, slot: Slot, event: protocol.Report) -> None:
        attempt = slot.current
        if attempt is None:
            return
        data = event.data
        if data.get("when") == "call" and self.memory.overran(slot, attempt):
            data.update(outcome="failed", longrepr=f"[devpool] {attempt.overrun}")
        elif data.get("outcome") == "failed" and self.memory.out_of_memory_beside(attempt, data):
            again.ask(attempt, Happened.RAN_OUT_BESIDE, self.ctx.settings)
        self.replay.replay(attempt, data, slot.worker)

    def _on_finish(self, slot: Slot, event: protocol.Finish) -> None:
        attempt = slot.current
        if attempt is None:
            return
        if isinstance(event.cpu, (int, float)) and event.cpu >= 0:
            attempt.cpu_load = float(event.cpu)
        self._finished(slot, attempt)
        location = tuple(event.location)
        self.hook.pytest_runtest_logfinish(nodeid=attempt.display, location=location)

    def _on_leak(self, slot: Slot, event: protocol.Leak) -> None:
        """What a test left in its worker, ended there (worker/leaks.py); a worker that
        could not be made clean again is retired after this test."""
        attempt = slot.current
        if attempt is not None and attempt.nodeid != event.nodeid:
            attempt = None  # a wider fixture's, found at its teardown
        self.leaks.reported(attempt, protocol.to_object(event), list(slot.worker.devices))
        if event.ended in ("retired", "not permitted"):
            slot.dirty = True

    def _on_shown(self, slot: Slot, event: protocol.Shown) -> None:
        self.replay.show(event.text)

    def _on_debugger(self, slot: Slot, event: protocol.Debugger) -> None:
        self.terminal.asked(slot, event.pid, event.post_mortem)

    def _on_debugger_left(self, slot: Slot, event: protocol.DebuggerLeft) -> None:
        self.terminal.left(slot)

    def _on_quit(self, slot: Slot, event: protocol.Quit) -> None:
        """pytest.exit() in a test, `q` at the debugger: the run ends as plain pytest's."""
        raise pytest.exit.Exception(event.msg, event.returncode)

    def _on_warning(self, slot: Slot, event: protocol.Warned) -> None:
        """A warning a test raised in its worker: for pytest's warnings summary and count."""
        nodeid = event.nodeid
        attempt = slot.current
        if attempt is not None and attempt.nodeid == nodeid:
            nodeid = attempt.display
        self.warned.tell(nodeid, event)

    def _on_renamed(self, slot: Slot, event: protocol.Renamed) -> None:
        """Said once per test: a worker's parametrize id differed, matched by place."""
        if event.nodeid not in self.renamed:
            self.renamed.add(event.nodeid)
            self.say(
                f"{event.nodeid} was collected as {event.as_} in a worker (a parametrize id "
                "built at collection differs); run by its position"
            )

    def _on_imported(self, slot: Slot, event: protocol.Imported) -> None:
        seen = self.ctx.imported.setdefault(len(slot.worker.devices), {})
        seen.update(dict.fromkeys(str(name) for name in event.modules))

    def _on_output(self, slot: Slot, event: protocol.Output) -> None:
        compat.outputs.received(self.config, event.pid, event.data)

    def _on_once_up(self, slot: Slot, event: protocol.OnceUp | protocol.OnceDown) -> None:
        raise protocol.ProtocolError(f"a test worker sent {event!r:.200}")  # run/once.py's

    _on_once_down = _on_once_up  # a once-fixture's process's events (run/once.py)

    def _on_missing(self, slot: Slot, event: protocol.Missing) -> None:
        attempt = self._sent(slot, event.nodeid)
        if attempt is not None:
            slot.dirty = True
            why = f"the worker did not collect {attempt.nodeid} (see {slot.worker.log})"
            self.endings.end(attempt, Outcome.INFRA, why, slot)

    def _on_done(self, slot: Slot, event: protocol.Done) -> None:
        if event.through < slot.streamed:
            return  # a part sent meanwhile is on its way: the worker answers it too
        # A batch cut for other runs' fair share (placing.share) says nothing of its tests:
        # those sent back do not count towards running alone.
        trimmed = self.placing.trimmed(slot.key)
        cut = "its batch was cut for other runs' fair share"
        why = cut if trimmed else "its batch ended before it ran"
        for attempt in [a for a in slot.sent if a.state is State.SENT]:
            self.endings.requeue(slot, attempt, why, not trimmed)
        slot.sent = []
        self._job_done(slot)

    def _sent(self, slot: Slot, nodeid: str) -> Attempt | None:
        for attempt in slot.sent:
            if attempt.state is State.SENT and attempt.nodeid == nodeid:
                return attempt
        return None

    def _finished(self, slot: Slot, attempt: Attempt) -> None:
        """The worker ran a test to its end: its reports decide, its deadline is void."""
        attempt.move(State.REPORTED, self.ctx.emit)
        outcome = self.replay.finished(attempt, slot.worker)
        decision = again.ask(attempt, Happened.FINISHED, self.ctx.settings, outcome)
        if outcome.gates or decision.runs:
            # An ordinary failure costs only its own outcome: the worker goes on with its
            # batch unless the project asked for a fresh process after every failure, or the
            # failure's output matches a fatal pattern (_check_fatal retires it).
            if self.ctx.settings.fresh_after_failure:
                slot.dirty = True
            self.endings.check_fatal(attempt, slot)
        if decision.runs:
            self.endings.again(slot, attempt, decision)

    def _job_done(self, slot: Slot) -> None:
        head = slot.head
        self._release_head(slot)
        now = clock.now()
        isolate = head is not None and head.fresh
        over_share = self.placing.over_share()
        if (
            slot.stopping
            or isolate
            or slot.dirty
            or slot.killed_for is not None
            or slot.worker.spent  # a rank group one rank's ending ended
            or over_share
            or self.ctx.settings.isolation in ("job", "module")
        ):
            self.pool.retire(slot, now)  # a failed test may have left the process in a bad state
        else:
            self.pool.idle[slot.key] = slot

    def _release_head(self, slot: Slot) -> None:
        """The worker is done with its placement: free it, and queue what must run again."""
        if slot.head is not None:
            self.scheduler.finish(slot.head)
            slot.head = None
        for job in slot.later:
            self.scheduler.add(job)
        slot.later = []

    def check_exits(self) -> None:
        """Workers that died without their pipe closing (a forked child kept it open)."""
        for slot in list(self.pool.slots.values()):
            if slot.worker.poll() is not None and not slot.worker.exited:
                for message in self.backend.drain(slot.worker):
                    self.handle(slot, message)
                self.exited(slot)

    def exited(self, slot: Slot) -> None:
        worker = slot.worker
        if worker.exited:
            return
        self.terminal.left(slot)
        code = self.pool.gone(slot)
        if slot.ready_by is None:  # it was ready for tests: did it hand back its output?
            compat.outputs.exited(self.config, worker.pid)
        attempt = slot.current
        waiting = [a for a in slot.sent if a.state is State.SENT]
        if attempt is not None:
            self.endings.lost_test(slot, attempt, code)
        elif waiting and slot.ready_by is not None and not slot.stopping:
            # It never got ready: a conftest that fails to import, a hung collection.
            self.endings.worker_failed(slot, waiting.pop(0), code)
        for other in waiting:
            self.endings.requeue(slot, other, f"its worker pid {worker.pid} ended before it ran")
        slot.sent = []
        self._release_head(slot)
        self.check_stop()  # a crash that reached --maxfail starts nothing that waited
        for placement in self.pool.freed(worker.key):
            self.placing.spawn(placement, clock.now())
