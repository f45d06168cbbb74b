"""The worker role of a worker session: run the node ids the controller sends, stream reports.

A worker runs batch after batch (protocol.Run, then its protocol.More parts) until told to
stop, and sends pytest's serialized reports back through its outbox (worker/held.py). A
failure, a fatal pattern, a leak it cannot undo, a cancel or a stop sends the rest of a
batch back untouched. A template (worker/template_role.py) runs no test: its forks do.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from typing import Any

import pytest

from devpool import compat
from devpool.devices import memory
from devpool.devices.probes import report_text
from devpool.history import preload
from devpool.worker import cpu_load, leaks, protocol, serialized, shown, warned, wire, worklist
from devpool.worker.held import Outbox
from devpool.worker.once import take_shipped
from devpool.worker.terminal import read_stdin_from


class WorkerRole:
    """A worker's part of its worker session: the batches it runs and what it reports."""

    def __init__(
        self,
        config: pytest.Config,
        outbox: Outbox,
        work: worklist.Worklist,
        watch: leaks.LeakWatch,
        once: warned.OnceWarnings,
        stop_at_failure: bool,
    ) -> None:
        self.config = config
        self.outbox = outbox
        self.worklist = work
        self.leaks = watch
        self.once = once  # warnings plain pytest shows once per run
        self.failed = False  # a test of the current batch failed
        # Set by the controller for projects that want a fresh process after any failure
        # (fresh-after-failure): the rest of such a batch goes back untouched.
        self.halt_on_failure = False
        self.hold_reports = False  # a test's reports wait for its end (--setup-show)
        self.fatal: list[re.Pattern[str]] = []  # a failure matching one may have poisoned us
        self.poisoned = False
        # A memory-leased test's call report goes at once: the controller measures its memory
        # when it comes (run/memory_watch.py), before the next test uses the device.
        self.reports_at_once = False
        # -x / --maxfail: the controller stops the run, but only a worker that stops at its
        # own failure runs no test after it (the controller's cancel would come later).
        self.stop_at_failure = stop_at_failure
        self.cpu = cpu_load.Meter()  # a device test's CPU load, for the scheduler's next run
        # What the tests import (history/preload.py): modules seen so far, and those that
        # tests imported without a warning, in order.
        self.known: set[str] = set()
        self.imported: dict[str, None] = {}
        # pytest records a test's warnings after its logfinish: what it imported is kept
        # (or not) at the next test's start, or at the end.
        self.just_imported: list[str] = []
        self.warned = False
        self.commands: wire.Commands | None = None
        self.stdin_read = False

    def send(self, *messages: protocol.Message) -> None:
        self.outbox.send(*messages)

    def run(self, session: pytest.Session, fd_in: int) -> None:
        """Run the batches read from fd_in until the stop, then tear down what is left."""
        items = {item.nodeid: item for item in session.items}
        order = {item.nodeid: index for index, item in enumerate(session.items)}
        self.known = set(sys.modules)
        memory.apply_torch_limit()  # a share of a device: torch's allocator stays inside it
        self.reports_at_once = bool(os.environ.get(memory.DEVICE_MEMORY))
        # --setup-show: a test's lines and reports go in one write at its end, so that a
        # parallel run's terminal shows each test's lines together, as plain pytest does.
        self.hold_reports = bool(self.config.getoption("setupshow", False))
        shown.carry(self.config, lambda text: self.outbox.held.append(protocol.Shown(text=text)))
        self.leaks.start_worker()
        self.send(protocol.Ready(pid=os.getpid(), collected=len(items)))
        setup_state: Any = session._setupstate  # noqa: SLF001 - see _run
        commands = self.commands = wire.Commands(fd_in)
        job, through, halted = None, 0, False
        while (message := commands.next()) is not None:
            if isinstance(message, protocol.Stop):
                break
            if isinstance(message, (protocol.Run, protocol.More)):
                take_shipped(self.config, message)
            if isinstance(message, protocol.Run):
                job, through, halted = message.job, 0, False
                self.failed = False
                self.halt_on_failure = message.fresh_after_failure
                self.fatal = [re.compile(source) for source in message.fatal]
                if message.stdin and not self.stdin_read:
                    # -s, one test at a time: input() reads the run's stdin, as in plain pytest
                    self.stdin_read = read_stdin_from(message.stdin)
            elif not isinstance(message, protocol.More) or message.job != job:
                continue  # a cancel that came after its batch had ended
            else:  # the rest of a batch that had ended here before it came
                through = max(through, message.seq)
            tests = list(message.tests)
            while tests:
                stopping = any(
                    isinstance(m, (protocol.Cancel, protocol.Stop)) for m in commands.pending()
                )
                halt = self.halt_on_failure or self.stop_at_failure
                if (self.failed and halt) or self.poisoned or halted or stopping:
                    # A cancel, a stop, a failure naming a fatal error, or any failure under
                    # -x / --maxfail or in a project that wants a fresh process after one:
                    # the rest of the batch goes back to the controller untouched.
                    halted = True
                    break
                test = tests.pop(0)
                # Which test and attempt this is, for the devpool_artifacts fixture.
                os.environ["DEVPOOL_TEST_ID"] = test.display
                os.environ["DEVPOOL_ATTEMPT"] = str(test.attempt)
                item = items.get(test.nodeid)
                if item is None:
                    item = self.worklist.by_place(items, test.nodeid)
                    if item is not None:
                        self.send(protocol.Renamed(nodeid=test.nodeid, as_=item.nodeid))
                if item is None:
                    self.send(protocol.Missing(nodeid=test.nodeid))
                else:
                    self._run(session, setup_state, item, order[item.nodeid])
                if not tests:  # the batch goes on if its next part came meanwhile
                    for more in commands.take(protocol.More):
                        if more.job == job:
                            through = max(through, more.seq)
                            tests += more.tests
                            take_shipped(self.config, more)
            skipped = [test.nodeid for test in tests]
            self.send(protocol.Done(job=message.job, skipped=skipped, through=through))
            commands.drop(protocol.Cancel)
        try:
            setup_state.teardown_exact(None)
        except Exception as exc:  # noqa: BLE001 - a teardown error must not hide the run's end
            print(f"devpool worker: error tearing down fixtures: {exc!r}", file=sys.stderr)
        left = self.leaks.at_exit()
        if left:
            with contextlib.suppress(OSError):  # the controller is gone: nobody to tell
                self.send(*left)
        with contextlib.suppress(OSError):  # the controller is gone: nobody to tell
            self.outbox.send_held()  # --setup-show's TEARDOWN lines of the widest fixtures

    def _run(
        self, session: pytest.Session, setup_state: Any, item: pytest.Item, index: int
    ) -> None:
        # The controller picks the order, so the item pytest would run next is only a guess
        # (the next one in collection order keeps module fixtures warm). Before each item,
        # tear down whatever the guess left standing that this item does not share.
        if self.outbox.held and _tears_down(setup_state, item):
            self.outbox.send_held()  # the last test has ended: a slow teardown here is not its time
        setup_state.teardown_exact(item)
        memory.reset_sim_usage()  # written by this test alone (the controller reads it)
        items = session.items
        nextitem = items[index + 1] if index + 1 < len(items) else None
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        sys.stdout.flush()
        sys.stderr.flush()

    def publish(self) -> None:
        """At the session's end: what the plugins published, and what the tests imported."""
        output = compat.outputs.encode(dict(self.config.workeroutput))  # type: ignore[attr-defined]
        self._keep_imports()
        imported = preload.libraries(self.imported, self.config.rootpath)
        with contextlib.suppress(OSError):  # the controller is gone: nobody to tell
            self.send(protocol.Output(pid=os.getpid(), data=output))
            if imported:
                self.send(protocol.Imported(modules=list(imported)))

    def _keep_imports(self) -> None:
        """What the last test imported is preloaded next run, unless it raised a warning."""
        if not self.warned:
            self.imported.update(dict.fromkeys(self.just_imported))
        self.just_imported, self.warned = [], False

    def started(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        """A test starts (pytest_runtest_logstart)."""
        nodeid = self.worklist.renamed.get(nodeid, nodeid)
        self.send(protocol.Start(nodeid=nodeid, location=list(location)))
        self._keep_imports()
        self.leaks.before(nodeid)
        if os.environ.get("DEVPOOL_DEVICES"):
            self.cpu.start()

    def warned_in_test(
        self, warning_message: Any, nodeid: str, location: tuple[str, int, str] | None
    ) -> None:
        """A test's warning goes to the controller's summary (pytest_warning_recorded)."""
        self.warned = True  # what this test imports is not preloaded (history/preload.py)
        # once: the controller keeps one of them, as plain pytest shows it once.
        once = self.once.once_of(warning_message)
        nodeid = self.worklist.renamed.get(nodeid, nodeid)
        self.send(serialized.warned(warning_message, nodeid, location, once))

    def reported(self, report: pytest.TestReport) -> None:
        """A test's report: sent now, or held for the next write (pytest_runtest_logreport)."""
        if report.failed:
            self.failed = True
            if self.fatal and not self.poisoned:
                text = report_text(report)
                self.poisoned = any(pattern.search(text) for pattern in self.fatal)
        data = self.config.hook.pytest_report_to_serializable(config=self.config, report=report)
        serialized.shown_subtest_values(data)
        message = protocol.Report(data=data)
        if report.when == "teardown" or self.hold_reports:
            # pytest calls logfinish right after the teardown report, with no test code
            # between: both wait for the next message (send).
            self.outbox.hold(message, keep=report.when != "teardown")
        elif report.failed or (self.reports_at_once and report.when == "call"):
            self.send(message)  # -x, fatal patterns and the terminal hear of it now
        else:
            self.outbox.hold(message, keep=True)  # the test's code runs on: kept in the file

    def finished(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        """A test has ended (pytest_runtest_logfinish): its leaks, then its finish, held."""
        load = self.cpu.load()
        if len(sys.modules) != len(self.known):  # the test imported modules
            self.just_imported = [name for name in sys.modules if name not in self.known]
            self.known.update(self.just_imported)
        cpu = None if load is None else round(load, 3)
        self._check_leaks(self.worklist.renamed.get(nodeid, nodeid))
        self.outbox.held.append(protocol.Finish(nodeid=nodeid, location=list(location), cpu=cpu))

    def _check_leaks(self, nodeid: str) -> None:
        """What the test left is ended before its finish goes out; in fail mode its own
        leaks fail its teardown. A leak the worker cannot undo sends the rest of the batch
        back (a fresh process runs it)."""
        found = self.leaks.after(nodeid)
        if not found:
            return
        text = self.leaks.failure_text(found, nodeid)
        held = self.outbox.held
        teardown = next(
            (
                m
                for m in reversed(held)
                if isinstance(m, protocol.Report) and m.data.get("when") == "teardown"
            ),
            None,
        )
        if teardown is not None:
            data = teardown.data
            # JUnit's <properties> of the test name each of its leaks (junitxml writes a
            # teardown report's user_properties).
            own = [m for m in found if m.nodeid == nodeid and not m.fixture]
            data.setdefault("user_properties", [])
            data["user_properties"] += [["devpool_leak", leaks.line(m)] for m in own]
            if text:
                data["outcome"] = "failed"
                data["longrepr"] = text
                self.failed = True
        # Before the teardown report and the finish: the controller knows the leak when it
        # concludes the test.
        self.outbox.insert(held.index(teardown) if teardown is not None else len(held), found)
        if self.leaks.retire:
            self.poisoned = True


def _tears_down(setup_state: Any, item: pytest.Item) -> bool:
    """Whether pytest's setup state holds fixtures this item does not share (to tear down)."""
    stack = getattr(setup_state, "stack", None)
    if not isinstance(stack, dict):
        return True
    needed = set(item.listchain())
    return any(node not in needed for node in stack)
