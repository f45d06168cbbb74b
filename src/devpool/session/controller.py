"""The controller: the user's pytest process. Owns the plan, the leases and the event loop.

It reacts to worker events and replays every report into pytest's own hooks, so the
terminal, --junitxml, -x, --lf and other plugins see one ordinary entry per test.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Generator, Mapping
from contextlib import nullcontext
from typing import Any, Protocol

import pytest

from devpool.backends import Backend
from devpool.backends.local import LocalBackend
from devpool.config import Settings
from devpool.devices import probes
from devpool.devices.cores import usable_cores
from devpool.devices.inventory import Inventory
from devpool.devices.lockdir import LockDir
from devpool.devices.probes import FatalPatterns
from devpool.errors import DevpoolError
from devpool.folders import devpool_dir
from devpool.history.durations import TestResult, default_history_path
from devpool.history.location import HistorySpec, preload_file
from devpool.history.quarantine import Entry
from devpool.outcomes import Outcome
from devpool.plan.jobs import Plan
from devpool.plan.markers import Request
from devpool.report import github, progress
from devpool.report.github import GitHubLog
from devpool.report.junit import EarlierAttempt
from devpool.report.record import LiveRecord, RecordWriter, host_name, read_record
from devpool.report.slow import SlowTests
from devpool.report.terminal import lend_endings, take_back, write_apart
from devpool.run.loop import Loop
from devpool.run.threads import ThreadBudget
from devpool.session import jobs, past_runs, queue_job, record_lines, summary, workers
from devpool.session.collected import read_requests
from devpool.session.header import report_header
from devpool.session.plain_collection import PlainCollection
from devpool.session.run_folder import make_run_folder, run_id
from devpool.session.sharding import keep_shard, parse_shard
from devpool.session.signals import sigterm_as_interrupt


class Listener(Protocol):
    """Anything that follows the run live (GitHub groups, progress display): gets each event."""

    def event(self, event_type: str, fields: Mapping[str, Any]) -> None: ...


class Controller:
    """The pytest plugin registered in the process the user started."""

    def __init__(
        self, config: pytest.Config, settings: Settings, inventory: Inventory, lock_dir: LockDir
    ) -> None:
        self.config = config
        self.settings = settings
        self.inventory = inventory
        self.lock_dir = lock_dir
        self.run_id = run_id()
        self.run_dir = settings.run_dir or config.rootpath / ".devpool" / "runs" / self.run_id
        self.log_dir = self.run_dir / "logs"
        self.requests: dict[str, Request] = {}
        self.asked: dict[str, int] = {}  # devices each test asks for, skipped here or not
        self.classes: dict[str, tuple[str, ...]] = {}  # each test's platforms filter
        self.failed_before: set[str] = set()  # with --ff / --lf: these start first
        self.deselected: list[tuple[str, str]] = []
        self.repeats: dict[str, list[tuple[Outcome, str]]] = {}
        self.retried: dict[str, list[EarlierAttempt]] = {}  # display id → attempts run again
        self.quarantined: dict[str, Entry] = {}  # node id → its quarantine
        self.quarantine_notes: list[str] = []  # expired or unmatched entries, said loudly
        self.bad_devices: dict[int, str] = {}  # device → why it was retired this session
        self.device_notes: list[str] = []  # devices checked after an error and kept
        self.run_notes: list[str] = []  # e.g. why the fork server could not fork
        # Seconds a worker template is expected to take to start and collect: this process
        # did the same work (interpreter, plugins, imports, collection) in about the CPU
        # time it had used once it had collected. Set then; a guess until then.
        self.startup_estimate = 1.0
        self.memory: dict[int, int] = {}  # bytes each device hands out to device_memory tests
        self.artifacts_dir = self.run_dir / "artifacts"
        self.fatal = FatalPatterns.for_platform(
            inventory.platform.name, inventory.platform.kind, settings.fatal_patterns
        )
        self.probe = (
            probes.probe_for(inventory.platform.kind, os.environ) if settings.probe else None
        )
        self.results: list[TestResult] = []  # for the duration history, at the end
        self.imported: dict[int, dict[str, None]] = {}  # kind → what its tests imported
        self.estimates: dict[str, float] = {}
        self.cpu_loads: dict[str, float] = {}  # device tests' cores kept busy, from history
        self.history_path: HistorySpec = settings.history or default_history_path(config.rootpath)
        self.preload_file = preload_file(self.history_path, config.rootpath)
        self.shard = parse_shard(settings.shard) if settings.shard else None
        self.releasable: list[str] = []
        self.items: dict[str, pytest.Item] = {}
        self.loop_ran = False  # the loop froze, then unfroze, the collector's objects
        devices = len(inventory.devices)
        self.max_parallel = settings.max_parallel or max(devices, settings.cpu_slots)
        self.threads = ThreadBudget.of(
            usable_cores(),
            self.max_parallel,
            settings.cpu_slots,
            devices,
            os.environ,
            per_node=settings.backend == "ray",  # each node's own cores (backends/ray/threads)
        )
        self.host = host_name()
        self.record_path = settings.run_record or self.run_dir / "record.jsonl"
        self.record: RecordWriter | None = None
        # The record as it is written, read by the code that reads a file: the terminal's
        # summary renders the same summary as `devpool report` (report.summary).
        self.live_record = LiveRecord(self.record_path)
        self.slow = SlowTests(settings.slow_timeout)
        self.listeners: list[Listener] = [self.live_record, self.slow]
        self.github: GitHubLog | None = None
        self.early_backend: LocalBackend | None = None  # started while collecting

    def make_backend(self, config: pytest.Config) -> Backend:
        """Local child processes, or Ray actors when --devpool-backend ray (see workers)."""
        return workers.make_backend(
            config,
            self.settings,
            self.inventory,
            self.run_dir,
            self.log_dir,
            self.items,
            self.early_backend,
        )

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_collection(self, session: pytest.Session) -> Generator[None, None, None]:
        """While this process collects, the fork server templates of the kinds the run will
        likely need collect too: forked from this process (or started afresh), before it
        imports a test module; workers fork from them once the plan is made. The test
        modules are then imported here without assertion rewriting (plain_collection)."""
        backend = workers.early_backend(session.config, self.settings, self.log_dir, self)
        if backend is not None:
            self.early_backend = backend
        plain = PlainCollection()
        plain.start()
        try:
            with sigterm_as_interrupt():  # a CI step's timeout while collecting: as Ctrl-C
                return (yield)
        finally:
            plain.stop()

    def emit(self, event_type: str, **fields: Any) -> None:
        """One run event: to the record (written at once) and to every live listener."""
        if self.record is not None:
            self.record.write(event_type, **fields)
        for listener in self.listeners:
            listener.event(event_type, fields)

    def flush_record(self) -> None:
        """Lines of the record that waited long enough go to disk (a run idles for long); the
        loop asks at least once a second, so SLOW lines that are due are said here too."""
        if self.record is not None:
            self.record.flush_due()
        lines = self.slow.due()
        terminal = self.config.pluginmanager.get_plugin("terminalreporter") if lines else None
        if terminal is not None:
            for line in lines:
                write_apart(terminal, line, yellow=True)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.early_backend is not None:  # the run ended before its loop (or after)
            self.early_backend.close()
        summary.fold_junit(self.config, self.retried, list(self.items))
        if self.record is None:
            return
        record_lines.end(self, exitstatus)  # session_end, and the record closed
        self.releasable = past_runs.leave_for_next(self, exitstatus)  # durations, cost, preload
        # Under `devpool run` the parent writes the step summary, also when this process dies.
        if self.github is not None and not os.environ.get("DEVPOOL_SUMMARY_BY_PARENT"):
            github.write_step_summary(read_record(self.record_path))

    # ---- pytest hooks -------------------------------------------------------------------

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """Every plugin has seen the whole heap (the loop unfroze it); pytest's last five
        collections at exit, for unraisable exceptions, need not walk the collection's
        objects again: one collection now, then they are frozen for the rest."""
        if self.loop_ran:
            gc.collect()
            gc.freeze()

    def pytest_report_header(self) -> list[str]:
        return report_header(
            self.settings,
            self.inventory,
            self.lock_dir,
            self.log_dir,
            self.threads,
            self.max_parallel,
            self.config.getoption("capture", None),
        )

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Read the requests once every pytest_collection_modifyitems has run.

        Markers a conftest adds there count; tryfirst, so that the terminal's
        "collected / deselected" line and --collect-only see devpool's selection."""
        config, items = session.config, session.items
        self.startup_estimate = max(0.1, time.process_time())
        platform = self.inventory.platform
        found = read_requests(items, self.settings, self.inventory)  # collected.py
        self.requests.update(found.requests)
        self.asked.update(found.asked)
        self.classes.update(found.classes)
        self.deselected += found.deselected
        keep = found.keep
        if found.dropped:
            config.hook.pytest_deselected(items=found.dropped)
            items[:] = keep
        try:
            past_runs.match_quarantine(
                keep, self.settings, platform, self.quarantined, self.quarantine_notes
            )
        except DevpoolError as exc:
            raise pytest.UsageError(str(exc)) from None
        split = past_runs.shard_split(self.shard, (item.nodeid for item in keep), os.environ)
        self.estimates, self.cpu_loads = past_runs.read_estimates(
            self.history_path, self.shard, self.quarantine_notes, platform.name, split
        )
        if self.shard is not None:
            keep_shard(self, config, items)
        self.failed_before = jobs.failed_before(config)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool | None:
        if session.config.option.collectonly:
            return None
        # From the plan to the last test: a CI step's timeout while the run is planned, joins
        # its queue or starts its record ends it as Ctrl-C too, not as a silent -15.
        with sigterm_as_interrupt():
            return self._run_tests(session)

    def _run_tests(self, session: pytest.Session) -> bool:
        if session.testsfailed and not session.config.option.continue_on_collection_errors:
            raise session.Interrupted(
                f"{session.testsfailed} error{'s' if session.testsfailed != 1 else ''}"
                " during collection"
            )
        self.items = {item.nodeid: item for item in session.items}
        if github.enabled(self.settings.github, os.environ):
            locations = {nodeid: item.location for nodeid, item in self.items.items()}
            self.github = GitHubLog(self.inventory.platform.name, locations)
            self.listeners.append(self.github)
        planned = jobs.jobs_for(session.items, self.requests, self.settings, self.failed_before)
        plan, self.memory = jobs.plan_run(
            planned, self.items, self.inventory, self.settings, self.estimates
        )
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        for note in plan.notes:
            if terminal is not None:
                terminal.write_line(f"devpool: {note}")
        backend = self.make_backend(session.config)
        jobs.fit_plan(plan, backend, self.settings, self.estimates, self.cpu_loads)
        if self.settings.plan:
            jobs.print_plan(self.config, plan, self.inventory, self.settings)
            backend.close()
            return True
        if self.settings.run_dir is None:
            devpool_dir(session.config.rootpath)  # with its .gitignore
        make_run_folder(self.run_dir, self.settings)  # private before anything goes in it
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # With --devpool-repeat, progress counts every repetition; a queue's job counts the
        # tests it claims, as it claims them (run/loop.py).
        collected = session.testscollected = len(plan.jobs) + len(plan.unsatisfiable)
        if self.settings.queue:
            session.testscollected = 0
        source = queue_job.join(self, plan, backend) if self.settings.queue else None
        # A queue's job plans no test of its own: its record counts the tests it claimed.
        record_lines.start(self, session.config, plan if source is None else Plan())
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        if terminal is not None:
            terminal.showfspath = False  # reports arrive interleaved across files
        if self.github is not None and terminal is not None:
            # pytest prints captured test output (FAILURES, -rP) as it is: fence the whole
            # run so no line a test printed can act as a workflow command.
            terminal.write_line(self.github.open_fence())
        loop = Loop(self, session, plan, backend, source)
        live = None
        if terminal is not None and progress.wanted(self.config.option):
            live = progress.LiveProgress(terminal._tw)
        try:
            with live or nullcontext():
                loop.live = live
                self.loop_ran = True
                if self.record is not None:
                    self.record.per_turn = True  # the loop flushes each turn (flush_record)
                loop.run()
        finally:
            if self.record is not None:
                self.record.per_turn = False
                self.record.flush()
            if source is not None:  # what it owes the queue, and what it did not run back
                self.run_notes += source.close()
                # a job that other jobs left nothing to exits 0, not "no tests collected"
                session.testscollected = session.testscollected or collected
        if session.shouldfail:
            raise session.Failed(session.shouldfail)
        if session.shouldstop:
            raise session.Interrupted(session.shouldstop)
        return True

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(
        self, report: pytest.TestReport, config: pytest.Config
    ) -> tuple[str, str, tuple[str, Mapping[str, bool]]] | None:
        return summary.teststatus(report)

    @pytest.hookimpl(wrapper=True, tryfirst=True, specname="pytest_terminal_summary")
    def pytest_terminal_summary_endings(self, terminalreporter: Any) -> Generator[None, None, None]:
        """Timeouts, crashes and infra endings under FAILURES and in the short test summary
        (-ra), as pytest shows any failure; the closing line still counts them apart.

        Outermost, so the reports are lent before pytest's terminal writes those sections
        and given back after, before it writes the closing line (see lend_endings)."""
        lent = lend_endings(terminalreporter.stats)
        try:
            return (yield)
        finally:
            take_back(terminalreporter.stats, lent)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        summary.write_summary(terminalreporter, self)
