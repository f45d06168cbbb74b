"""Worker side: a child pytest bound to one lease; runs the items it is sent, streams reports."""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import gc
import os
import re
import signal
import sys
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from devpool import compat
from devpool.devices import memory
from devpool.devices.probes import report_text
from devpool.history import preload
from devpool.worker import (
    capture,
    cpu_load,
    leaks,
    native_threads,
    protocol,
    serialized,
    shown,
    warned,
    wire,
    worklist,
)
from devpool.worker import template as forkserver
from devpool.worker.held import HeldFile, held_file
from devpool.worker.once import ONCE_ENV, OnceProcess, take_shipped
from devpool.worker.terminal import Terminal, read_stdin_from

# Options that select or stop tests belong to the controller alone: the worker must be
# able to run any node id it is sent, and never stop itself on a failure.
_CONTROLLER_ONLY = {"keyword": "", "markexpr": "", "lf": False, "failedfirst": False,
                    "newfirst": False, "stepwise": False, "stepwise_skip": False,
                    "maxfail": 0, "deselect": []}  # fmt: skip


def _die_with_parent(name: bytes) -> None:
    """Ask Linux to SIGKILL this worker when the controller dies, so no orphan keeps a device;
    and name it (ps -o comm, /proc/PID/comm): a template forked from the controller keeps
    the controller's command line."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        libc.prctl(15, ctypes.c_char_p(name[:15]))  # PR_SET_NAME
    except (OSError, AttributeError):
        return


def exit_without_teardown(code: int) -> NoReturn:
    """End a forked process as interpreter exit would, without tearing the interpreter
    down: join non-daemon threads and run threading's exit hooks (concurrent.futures
    finishes queued work), then every atexit handler (tests', plugins', logging's)."""
    import atexit
    import threading

    threading._shutdown()  # type: ignore[attr-defined]  # noqa: SLF001
    atexit._run_exitfuncs()  # noqa: SLF001
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


class WorkerSession:
    """The pytest plugin a worker registers instead of the controller."""

    def __init__(self, config: pytest.Config, spec: str) -> None:
        self.config = config
        # A template (fork server) collects, then forks workers: "template,SOCKET,PARENT",
        # and on a Ray node ",PATH": where the node's rank actors ask it for forks too.
        self.template: forkserver.Template | None = None
        if spec.startswith("template,"):
            _, sock, parent_pid, *listen = spec.split(",", 3)
            parent = int(parent_pid)
            self.template = forkserver.Template(int(sock), listen[0] if listen else None)
            self.fd_in = self.fd_out = -1  # a forked child gets its own pipes
        else:
            fd_in, fd_out, parent = (int(part) for part in spec.split(","))
            self.fd_in, self.fd_out = fd_in, fd_out
        self.failed = False  # a test of the current batch failed
        # Set by the controller for projects that want a fresh process after any failure
        # (fresh-after-failure): the rest of such a batch goes back untouched.
        self.halt_on_failure = False
        self.hold_reports = False  # a test's reports wait for its end (--setup-show)
        self.fatal: list[re.Pattern[str]] = []  # a failure matching one may have poisoned us
        self.poisoned = False
        self.renamed: dict[str, str] = {}  # this process's node id → the controller's
        # A passing test's reports and its finish wait for the next message (the next test's
        # start, or the batch's done): one write per test. Those held while test code runs
        # are also in the held file, for the controller if this process dies (worker/held.py).
        self._held: list[protocol.Message] = []
        self._kept, self._kept_count = b"", 0  # the encoded head of _held, in the held file
        self.kept = HeldFile(None)
        # A memory-leased test's call report goes at once: the controller measures its memory
        # when it comes (run/memory_watch.py), before the next test uses the device.
        self.reports_at_once = False
        _die_with_parent(b"devpool-tmpl" if self.template is not None else b"devpool-worker")
        if os.getppid() != parent:  # the controller died before prctl took effect
            os._exit(3)
        # -x / --maxfail: the controller stops the run, but only a worker that stops at its
        # own failure runs no test after it (the controller's cancel would come later).
        self.stop_at_failure = bool(getattr(config.option, "maxfail", 0))
        for name, value in _CONTROLLER_ONLY.items():
            if hasattr(config.option, name):
                setattr(config.option, name, value)
        # Not an xdist worker (plugins would read xdist's keys): other plugins are adjusted
        # one by one, e.g. junitxml and --lf state are written by the controller alone.
        # What they publish for the controller goes where xdist's workers put it.
        config.workeroutput = {}  # type: ignore[attr-defined]
        compat.configure_worker(config)
        only = os.environ.get("DEVPOOL_COLLECT_ONLY")
        self.modules: set[str] | None = None
        if only:
            self.modules = set(Path(only).read_text(encoding="utf-8").split("\n")) - {""}
        # The file of the controller's selection (None: keep what this process's collection
        # keeps), and what it holds.
        self.selected_from = os.environ.get(worklist.NODEIDS_ENV)
        self.selected = _selection(self.selected_from)
        self.collected: list[pytest.Item] = []  # every item, before any collection hook
        self._stacks: Any = None
        self._log: Path | None = None  # this process's log (the backends name it so)
        self._open_stacks()
        self.forked = False  # a child of a template: it ends without interpreter shutdown
        self.exitstatus = 0
        self.cpu = cpu_load.Meter()  # a device test's CPU load, for the scheduler's next run
        # What the tests import (history/preload.py): modules seen so far, and those that
        # tests imported without a warning, in order.
        self.known: set[str] = set()
        self.imported: dict[str, None] = {}
        # pytest records a test's warnings after its logfinish: what it imported is kept
        # (or not) at the next test's start, or at the end.
        self.just_imported: list[str] = []
        self.warned = False
        # A template: the threads it runs, and the first test module after whose import it
        # ran more (an OpenMP pool started at import): that module may be left out of it.
        self.tasks = native_threads.thread_count() if self.template is not None else 1
        self.culprit: str | None = None
        self.once = warned.OnceWarnings()  # warnings plain pytest shows once per run
        config.pluginmanager.register(self.once, "devpool-once-warnings")
        self.commands: wire.Commands | None = None
        self.stdin_read = False
        # The debugger's prompt gets the controller's terminal (worker/terminal.py).
        self.terminal = Terminal.install(config, self.send, lambda: self.commands)
        # What each test leaves behind (processes, threads, device memory): worker/leaks.py.
        self.leaks = leaks.LeakWatch()
        if self.leaks.active:
            config.pluginmanager.register(self.leaks, "devpool-leaks")

    def _exit_forked(self) -> None:
        """A forked worker ends here, once pytest and the plugins are done: the atexit
        handlers (tests', plugins', logging's) run, and then the process exits without
        tearing the interpreter down. Finalising every module and object it shares with its
        template would copy most of its pages (seconds of CPU with torch imported)."""
        if self.forked:
            exit_without_teardown(self.exitstatus)

    def _exit_last(self) -> None:
        """Make the forked exit the config's outermost cleanup: every cleanup registered so
        far (capture, assertion rewriting, plugins') and later runs before it."""
        config: Any = self.config
        stack = getattr(config, "_cleanup_stack", None)  # pytest >= 8.1
        if isinstance(stack, contextlib.ExitStack):
            outer = contextlib.ExitStack()
            outer.callback(self._exit_forked)
            outer.enter_context(stack)
            config._cleanup_stack = outer  # noqa: SLF001
            return
        cleanups = getattr(config, "_cleanup", None)  # pytest 8.0: a list popped from the end
        if isinstance(cleanups, list):
            cleanups.insert(0, self._exit_forked)
        else:
            config.add_cleanup(self._exit_forked)

    def _open_stacks(self) -> None:
        """faulthandler writes every thread's stack to this file when the controller asks."""
        stacks = os.environ.get("DEVPOOL_STACKS_FILE")
        inherited = self._stacks  # a forked child's copy of its template's file
        if stacks:
            self._log = Path(stacks).with_suffix(".log")
            self._stacks = open(stacks, "w")  # noqa: SIM115 - lives as long as the process
            faulthandler.register(signal.SIGUSR1, file=self._stacks, all_threads=True)
            if self.template is None:  # a worker (a template runs no test)
                self.kept.close()
                self.kept = HeldFile(held_file(Path(stacks)))
        if inherited is not None and inherited is not self._stacks:
            # Closed here, never left to the collector: its ResourceWarning would reach the
            # first test, an error under filterwarnings = error.
            inherited.close()

    def pytest_ignore_collect(self, collection_path: Path) -> bool | None:
        """Skip test modules that hold none of this worker's jobs: no import, no collection."""
        if self.modules is None or collection_path.suffix != ".py":
            return None
        if collection_path.name in ("conftest.py", "__init__.py"):
            return None
        return True if str(collection_path) not in self.modules else None

    def pytest_unconfigure(self) -> None:
        stacks = os.environ.get("DEVPOOL_STACKS_FILE")
        self.kept.close(remove=True)  # it ends normally: everything held was sent
        if stacks:  # a worker that ends normally leaves no empty output files behind
            capture.remove_empty(Path(stacks))

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(
        self, session: pytest.Session, exitstatus: int
    ) -> Generator[None, None, None]:
        """After every plugin's pytest_sessionfinish: what they published, to the controller."""
        self.exitstatus = int(exitstatus)
        try:
            return (yield)
        finally:
            if self.template is None and self.fd_out >= 0:
                output = compat.outputs.encode(dict(self.config.workeroutput))  # type: ignore[attr-defined]
                self._keep_imports()
                imported = preload.libraries(self.imported, self.config.rootpath)
                with contextlib.suppress(OSError):  # the controller is gone: nobody to tell
                    self.send(protocol.Output(pid=os.getpid(), data=output))
                    if imported:
                        self.send(protocol.Imported(modules=list(imported)))

    def pytest_itemcollected(self, item: pytest.Item) -> None:
        self.collected.append(item)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        """A template forks only what a fresh worker would have collected the same way."""
        if self.template is None:
            return
        why = ""
        runtime = forkserver.initialised_runtime(self.config)
        if runtime:
            # A device context cannot be shared with children, and the template holds no
            # lease: it ends now rather than keep a context on a device it does not own.
            why = f"importing {report.nodeid or 'the conftest files'} initialised {runtime}"
        elif report.failed:
            why = f"collecting {report.nodeid or 'the conftest files'} failed in the template"
        module = report.nodeid.split("::")[0]
        path = os.path.normpath(self.config.rootpath / module) if module.endswith(".py") else None
        if why:
            self.template.refuse(why, path)
            os._exit(0)
        if path is not None and "::" not in report.nodeid and self.culprit is None:
            tasks = native_threads.thread_count()
            if tasks > self.tasks:
                self.culprit = path
            self.tasks = tasks

    def _preload(self) -> Callable[[str], str]:
        """Import what this kind's tests imported last run (history/preload.py); returns
        what the template says if it is then unsafe to fork (and what it learnt is kept)."""
        path = os.environ.get(preload.PRELOAD_ENV)
        size = len([d for d in os.environ.get("DEVPOOL_DEVICES", "").split(",") if d])
        if not path:
            return str
        names = preload.modules_of(Path(path), size)
        done = forkserver.preload(names)
        if done.warned:
            preload.write(Path(path), {}, never={size: done.warned})
        if not done.count:
            return str

        def unsafe(why: str) -> str:
            # Its threads came with these imports: never again. Else who knows: drop all.
            if done.threaded:
                preload.write(Path(path), {}, never={size: done.threaded})
            else:
                preload.write(Path(path), {}, dropped=[size])
            return (
                f"{why} (after importing {done.count} modules its tests imported last run; "
                "they are not imported first again)"
            )

        return unsafe

    def _keep_imports(self) -> None:
        """What the last test imported is preloaded next run, unless it raised a warning."""
        if not self.warned:
            self.imported.update(dict.fromkeys(self.just_imported))
        self.just_imported, self.warned = [], False

    def _become(self, session: pytest.Session, fork: forkserver.Fork) -> None:
        """In a child the template forked: a worker of its own, on the pipes it was sent."""
        _die_with_parent(b"devpool-worker")
        if os.getppid() != fork.template_pid:  # the template died before prctl took effect
            os._exit(3)
        forkserver.become_worker(self.config, fork, self._log)
        # The template froze what it collected (its pages stay shared while it forks); a
        # test must find every object in the collector's sight, as in plain pytest.
        gc.unfreeze()
        self.forked = True
        self._exit_last()
        self.template = None
        self.fd_in, self.fd_out = fork.commands, fork.events
        self._open_stacks()
        self._select(session, os.environ.get(worklist.NODEIDS_ENV))

    def _select(self, session: pytest.Session, path: str | None) -> None:
        """Keep the selection in the file at path, over the same collection (see
        pytest_collection_finish); nothing to do when this process kept it already.

        A template started while the controller was still collecting had no selection yet:
        it applies the one its first fork request names before it forks (Template.serve's
        prepare), so its children do not each read the file and walk every item again."""
        if path == self.selected_from:
            return
        self.selected_from = path
        self.selected = _selection(path)
        if self.selected is not None:
            session.items[:] = worklist.restrict(self.collected, session.items, self.selected)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """The controller's selection is final: keep exactly its node ids.

        After every pytest_collection_modifyitems: a conftest that deselects by position
        (items[K::N]) sees fewer items here than in the controller and would pick others."""
        if self.selected is not None:
            session.items[:] = worklist.restrict(self.collected, session.items, self.selected)

    def send(self, *messages: protocol.Message) -> None:
        """Send messages after those held (they keep their order), in one write."""
        held, self._held = self._held[self._kept_count :], []
        encoded, self._kept, self._kept_count = self._kept, b"", 0
        self.kept.clear()  # before the write: no message is read twice
        wire.write(self.fd_out, *held, *messages, encoded=encoded)

    def _send_held(self) -> None:
        if self._held:
            self.send()

    def _hold(self, message: protocol.Message, keep: bool) -> None:
        """Hold a message for the next write; keep: test code runs before that write (held file)."""
        self._held.append(message)
        if keep:
            fresh = self._held[self._kept_count :]
            self._kept += b"".join(protocol.encode(m) for m in fresh)
            self._kept_count = len(self._held)
            self.kept.put(self._kept)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        if self.template is not None:
            preloaded = self._preload()
            gc.freeze()  # what collection built is shared by every child, copy-on-write
            fork = self.template.serve(
                self.config,
                preloaded,
                self.culprit,
                lambda env: self._select(session, env.get(worklist.NODEIDS_ENV)),
            )
            if fork is None:
                self._no_summary()
                return True  # the template's work is done
            self._become(session, fork)
            if os.environ.get(ONCE_ENV):  # a once-fixture's own process (run/once_process.py)
                return OnceProcess.forked(self.config).pytest_runtestloop(session)
        items = {item.nodeid: item for item in session.items}
        order = {item.nodeid: index for index, item in enumerate(session.items)}
        self.known = set(sys.modules)
        memory.apply_torch_limit()  # a share of a device: torch's allocator stays inside it
        self.reports_at_once = bool(os.environ.get(memory.DEVICE_MEMORY))
        # --setup-show: a test's lines and reports go in one write at its end, so that a
        # parallel run's terminal shows each test's lines together, as plain pytest does.
        self.hold_reports = bool(self.config.getoption("setupshow", False))
        shown.carry(self.config, lambda text: self._held.append(protocol.Shown(text=text)))
        self.leaks.start_worker()
        self.send(protocol.Ready(pid=os.getpid(), collected=len(items)))
        setup_state: Any = session._setupstate  # noqa: SLF001 - see _run
        commands = self.commands = wire.Commands(self.fd_in)
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
                item = items.get(test.nodeid) or self._by_place(items, test.nodeid)
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
            self._send_held()  # --setup-show's TEARDOWN lines of the widest fixtures
        if self.forked:
            # Every test and fixture has ended. pytest collects the cycles five times at exit
            # (unraisableexception); over the template's whole heap each pass would write
            # every page it shares with the template. Tests can no longer see the difference.
            gc.freeze()
        self._no_summary()
        return True

    def _no_summary(self) -> None:
        """The controller writes the summary; a worker's would cost its devices' next user
        time: plugins' pytest_terminal_summary may import whole packages at exit
        (hypothesis does, assertion-rewritten: seconds of CPU without a bytecode cache)."""
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            self.config.pluginmanager.unregister(reporter)

    def _run(
        self, session: pytest.Session, setup_state: Any, item: pytest.Item, index: int
    ) -> None:
        # The controller picks the order, so the item pytest would run next is only a guess
        # (the next one in collection order keeps module fixtures warm). Before each item,
        # tear down whatever the guess left standing that this item does not share.
        if self._held and _tears_down(setup_state, item):
            self._send_held()  # the last test has ended: a slow teardown here is not its time
        setup_state.teardown_exact(item)
        memory.reset_sim_usage()  # written by this test alone (the controller reads it)
        items = session.items
        nextitem = items[index + 1] if index + 1 < len(items) else None
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        sys.stdout.flush()
        sys.stderr.flush()

    def _by_place(self, items: dict[str, pytest.Item], nodeid: str) -> pytest.Item | None:
        """The item at the controller's item's place, when their parametrize ids differ (ids
        built from the clock, a seed or a temporary path at collection)."""
        if self.selected is None:
            return None
        place = self.selected.place_of(nodeid)
        if place is None:
            return None
        for item in items.values():
            if item.nodeid not in self.selected and worklist.place(item) == place:
                self.renamed[item.nodeid] = nodeid
                self.send(protocol.Renamed(nodeid=nodeid, as_=item.nodeid))
                return item
        return None

    def pytest_runtest_logstart(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        nodeid = self.renamed.get(nodeid, nodeid)
        self.send(protocol.Start(nodeid=nodeid, location=list(location)))
        self._keep_imports()
        self.leaks.before(nodeid)
        if os.environ.get("DEVPOOL_DEVICES"):
            self.cpu.start()

    def pytest_warning_recorded(
        self,
        warning_message: Any,
        when: str,
        nodeid: str,
        location: tuple[str, int, str] | None,
    ) -> None:
        """Warnings of the tests go to the controller's summary; those of collection and
        configuration it saw itself."""
        if when != "runtest":
            return
        self.warned = True  # what this test imports is not preloaded (history/preload.py)
        # once: the controller keeps one of them, as plain pytest shows it once.
        once = self.once.once_of(warning_message)
        nodeid = self.renamed.get(nodeid, nodeid)
        self.send(serialized.warned(warning_message, nodeid, location, once))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
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
            self._hold(message, keep=report.when != "teardown")
        elif report.failed or (self.reports_at_once and report.when == "call"):
            self.send(message)  # -x, fatal patterns and the terminal hear of it now
        else:
            self._hold(message, keep=True)  # the test's code runs on: kept in the file

    def pytest_runtest_logfinish(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        load = self.cpu.load()
        if len(sys.modules) != len(self.known):  # the test imported modules
            self.just_imported = [name for name in sys.modules if name not in self.known]
            self.known.update(self.just_imported)
        cpu = None if load is None else round(load, 3)
        self._check_leaks(self.renamed.get(nodeid, nodeid))
        self._held.append(protocol.Finish(nodeid=nodeid, location=list(location), cpu=cpu))

    def _check_leaks(self, nodeid: str) -> None:
        """What the test left is ended before its finish goes out; in fail mode its own
        leaks fail its teardown. A leak the worker cannot undo sends the rest of the batch
        back (a fresh process runs it)."""
        found = self.leaks.after(nodeid)
        if not found:
            return
        text = self.leaks.failure_text(found, nodeid)
        teardown = next(
            (
                m
                for m in reversed(self._held)
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
        at = self._held.index(teardown) if teardown is not None else len(self._held)
        if at < self._kept_count:  # never: the teardown report is held, not kept
            self._kept, self._kept_count = b"", 0
        self._held[at:at] = found
        if self.leaks.retire:
            self.poisoned = True


def _tears_down(setup_state: Any, item: pytest.Item) -> bool:
    """Whether pytest's setup state holds fixtures this item does not share (to tear down)."""
    stack = getattr(setup_state, "stack", None)
    if not isinstance(stack, dict):
        return True
    needed = set(item.listchain())
    return any(node not in needed for node in stack)


def _selection(path: str | None) -> worklist.Selection | None:
    """The controller's selected node ids (the file DEVPOOL_NODEIDS names), None when not
    given."""
    if not path:
        return None
    try:
        return worklist.read_selection(Path(path))
    except OSError as exc:  # e.g. a Ray node with shipped code cannot see the controller's file
        print(f"devpool worker: runs without the controller's selection: {exc}", file=sys.stderr)
        return None
