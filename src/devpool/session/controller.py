"""The controller: the user's pytest process. Owns the plan, the leases and the event loop.

It reacts to worker events and replays every report into pytest's own hooks, so the
terminal, --junitxml, -x, --lf and other plugins see one ordinary entry per test.
"""

from __future__ import annotations

import datetime as dt
import gc
import os
import re
import shutil
import signal
import time
from collections.abc import Generator, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import pytest

from devpool import compat
from devpool.backends import Backend
from devpool.backends.local import LocalBackend
from devpool.capacity import shards
from devpool.compat import coverage
from devpool.config import Settings
from devpool.devices import memory, probes
from devpool.devices.inventory import Inventory
from devpool.devices.lockdir import LockDir
from devpool.devices.probes import FatalPatterns
from devpool.errors import DevpoolError
from devpool.history.durations import (
    History,
    TestResult,
    default_history_path,
    pending_dir,
    pending_files,
    write_pending,
)
from devpool.history.quarantine import Entry, Quarantine, entries_from_file, entries_from_table
from devpool.outcomes import RERUN, Outcome
from devpool.plan import chains
from devpool.plan.jobs import Job, Plan, build_plan
from devpool.plan.markers import Request, request_for
from devpool.report import github, progress
from devpool.report.github import GitHubLog
from devpool.report.junit import Attempt, fold_attempts
from devpool.report.record import RecordWriter, host_name, read_record
from devpool.report.terminal import (
    Trouble,
    lend_endings,
    print_repeats,
    print_summary,
    take_back,
)
from devpool.run.loop import Loop
from devpool.run.pool import template_kind, templates_env
from devpool.select import session as select_session
from devpool.worker import worklist

RELEASE_AFTER = 5  # passes in a row after which a quarantined test is ready to release
RUN_ID = re.compile(r"\d{8}-\d{6}-\d+")  # the folders devpool itself made under .devpool/runs


class Listener(Protocol):
    """Anything that follows the run live (GitHub groups, progress display): gets each event."""

    def event(self, event_type: str, fields: Mapping[str, Any]) -> None: ...


def run_id() -> str:
    """This run's id: the one `devpool run` gave its run folder (DEVPOOL_RUN_ID), else new."""
    given = os.environ.get("DEVPOOL_RUN_ID", "")
    if RUN_ID.fullmatch(given):
        return given
    return time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"


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
        self.failed_before: set[str] = set()  # with --ff / --lf: these start first
        self.deselected: list[tuple[str, str]] = []
        self.troubles: list[Trouble] = []
        self.repeats: dict[str, list[tuple[Outcome, str]]] = {}
        self.retried: dict[str, list[Attempt]] = {}  # display id → attempts run again
        self.quarantined: dict[str, Entry] = {}  # node id → its quarantine
        self.quarantine_notes: list[str] = []  # expired or unmatched entries, said loudly
        self.quarantine_failures: list[Trouble] = []
        self.bad_devices: dict[int, str] = {}  # device → why it was retired this session
        self.device_notes: list[str] = []  # devices checked after an error and kept
        self.run_notes: list[str] = []  # e.g. why the fork server could not fork
        self.memory: dict[int, int] = {}  # bytes each device hands out to device_memory tests
        self.artifacts_dir = self.run_dir / "artifacts"
        self.fatal = FatalPatterns.for_platform(
            inventory.platform.name, inventory.platform.kind, settings.fatal_patterns
        )
        self.probe = (
            probes.probe_for(inventory.platform.kind, os.environ) if settings.probe else None
        )
        self.results: list[TestResult] = []  # for the duration history, at the end
        self.estimates: dict[str, float] = {}
        self.history_path = settings.history or default_history_path(config.rootpath)
        self.shard = shards.parse_shard(settings.shard) if settings.shard else None
        self.releasable: list[str] = []
        self.items: dict[str, pytest.Item] = {}
        self.loop_ran = False  # the loop froze, then unfroze, the collector's objects
        devices = len(inventory.devices)
        self.max_parallel = settings.max_parallel or max(devices, settings.cpu_slots)
        self.host = host_name()
        self.record_path = settings.run_record or self.run_dir / "record.jsonl"
        self.record: RecordWriter | None = None
        self.listeners: list[Listener] = []
        self.github: GitHubLog | None = None
        self.early_backend: LocalBackend | None = None  # started while collecting

    def make_backend(self, config: pytest.Config) -> Backend:
        """Local child processes, or Ray actors when --devpool-backend ray.

        Workers get this process's rootdir, inifile and final selection (see worklist)."""
        cwd = config.invocation_params.dir
        args, env = self._worker_setup(config)
        if not self.settings.plan:  # --devpool-plan starts no worker and leaves no folder
            selected = worklist.write_selection(self.items.values(), self.run_dir / "collect")
            env[worklist.NODEIDS_ENV] = str(selected)
        if self.settings.backend == "ray":
            from devpool.backends.ray import RayBackend

            return RayBackend(args, cwd, self.log_dir, self.settings, self.inventory, env)
        if self.early_backend is not None:
            self.early_backend.worker_env.update(env)  # the selection, now that it is known
            return self.early_backend
        return LocalBackend(args, cwd, self.log_dir, env, self.settings.worker_start_timeout)

    def _worker_setup(self, config: pytest.Config) -> tuple[list[str], dict[str, str]]:
        """Every worker's pytest arguments, and the environment all of them share."""
        # Other plugins' settings that every worker must share (seed, coverage): see compat.
        args = [
            *worklist.worker_args(config),
            *compat.worker_options(config),
            *select_session.worker_options(config),
        ]
        return args, compat.worker_env(config)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection(self, session: pytest.Session) -> None:
        """While this process collects, a fork server template for CPU-only workers collects
        too: they fork from it once the plan is made, instead of each collecting again."""
        config = session.config
        settings = self.settings
        if settings.backend != "local" or not settings.fork_server or settings.plan:
            return
        if config.option.collectonly:
            return
        if coverage.measuring() is not None:
            return  # workers measure coverage: no template would be safe to fork (forkserver)
        args, env = self._worker_setup(config)
        cwd = config.invocation_params.dir
        backend = LocalBackend(args, cwd, self.log_dir, env, settings.worker_start_timeout)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        backend.prepare(template_kind(0), templates_env(self, ()))
        self.early_backend = backend

    def emit(self, event_type: str, **fields: Any) -> None:
        """One run event: to the record (written at once) and to every live listener."""
        if self.record is not None:
            self.record.write(event_type, **fields)
        for listener in self.listeners:
            listener.event(event_type, fields)

    def flush_record(self) -> None:
        """Lines of the record that waited long enough go to disk (a run idles for long)."""
        if self.record is not None:
            self.record.flush_due()

    def _write_history(self) -> None:
        """Add this run's durations to the history; a shard run writes a pending file instead.

        The other shards of a CI run split from the history as it was: a shard that
        changed it would change their split (tests run twice or never).
        """
        if not self.results:
            return
        try:
            if self.shard is None:
                with History(self.history_path) as history:
                    history.add(self.results)
                    self.releasable = self._ready_to_release(history)
                return
            write_pending(self.history_path, self.run_id, self.results)
            names = sorted({r.nodeid for r in self.results if r.nodeid in self.quarantined})
            if names and self.history_path.exists():
                passed = [Outcome.PASSED.value] * RELEASE_AFTER
                with History(self.history_path) as history:
                    self.releasable = [
                        n
                        for n in names
                        if history.recent_outcomes(n, RELEASE_AFTER, self.results) == passed
                    ]
        except (DevpoolError, OSError) as exc:
            self.quarantine_notes.append(f"duration history not written: {exc}")

    def _ready_to_release(self, history: History) -> list[str]:
        """Quarantined tests that passed the last RELEASE_AFTER times they ran."""
        names = sorted({r.nodeid for r in self.results if r.nodeid in self.quarantined})
        passed = [Outcome.PASSED.value] * RELEASE_AFTER
        return [n for n in names if history.recent_outcomes(n, RELEASE_AFTER) == passed]

    def _prune_runs(self) -> None:
        """Keep the newest --devpool-keep-runs run folders under .devpool/runs, not all ever."""
        if self.settings.run_dir is not None:
            return  # the user chose where this run goes: leave their folders alone
        runs = self.run_dir.parent
        old = sorted(
            (p for p in runs.iterdir() if p.is_dir() and RUN_ID.fullmatch(p.name)),
            key=lambda p: p.name,
        )
        for folder in old[: max(0, len(old) - self.settings.keep_runs)]:
            shutil.rmtree(folder, ignore_errors=True)

    def _start_record(self, session: pytest.Session, plan: Plan) -> None:
        self._prune_runs()
        self.record = RecordWriter(self.record_path)
        inventory = self.inventory
        options = {
            name: str(value) if isinstance(value, Path) else value
            for name, value in vars(self.settings).items()
            if name not in ("platforms", "devices")
        }
        self.emit(
            "session_start",
            run_id=self.run_id,
            host=self.host,
            pid=os.getpid(),
            args=list(session.config.invocation_params.args),
            cwd=str(session.config.invocation_params.dir),
            platform=inventory.platform.name,
            kind=inventory.platform.kind,
            devices=list(inventory.devices),
            source=inventory.source,
            options=options,
            tests=len(plan.jobs) + len(plan.unsatisfiable),
            planned=[job.display for job in plan.jobs] + [j.display for j, _ in plan.unsatisfiable],
            log_dir=str(self.log_dir),
            memory={str(d): b for d, b in self.memory.items()},
        )

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.early_backend is not None:  # the run ended before its loop (or after)
            self.early_backend.close()
        xmlpath = getattr(self.config.option, "xmlpath", None)
        if xmlpath and self.retried and os.path.exists(xmlpath):
            prefix = getattr(self.config.option, "junitprefix", None)
            fold_attempts(Path(xmlpath), _junit_keys(self.retried, prefix))
        if self.record is None:
            return
        counts: dict[str, int] = {}
        for trouble in self.troubles:
            counts[trouble.outcome.value] = counts.get(trouble.outcome.value, 0) + 1
        self.emit("session_end", exitstatus=int(exitstatus), troubles=counts)
        self.record.close()
        self._write_history()
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
        lines = [
            f"devpool: {self.inventory.describe()} from {self.inventory.source}; "
            f"max-parallel {self.max_parallel}, cpu slots {self.settings.cpu_slots}",
            f"devpool: lock dir {self.lock_dir.path}; logs {self.log_dir}",
        ]
        if not self.inventory.devices:
            action = "skip" if self.settings.skip_unsatisfiable else "fail"
            lines[0] = (
                f"devpool: {self.inventory.source}: CPU tests run, tests that need devices "
                f"{action} as unsatisfiable; max-parallel {self.max_parallel}, "
                f"cpu slots {self.settings.cpu_slots}"
            )
        return lines

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Read the requests once every pytest_collection_modifyitems has run.

        Markers a conftest adds there count; tryfirst, so that the terminal's
        "collected / deselected" line and --collect-only see devpool's selection."""
        config, items = session.config, session.items
        platform = self.inventory.platform
        keep: list[pytest.Item] = []
        dropped: list[pytest.Item] = []
        for item in items:
            try:
                request = request_for(item, self.settings.platforms, self.settings.device_memory)
            except DevpoolError as exc:
                raise pytest.UsageError(str(exc)) from None
            if request.platforms is not None and not (
                platform.name in request.platforms or platform.kind in request.platforms
            ):
                listed = ", ".join(request.platforms)
                self.deselected.append(
                    (item.nodeid, f"platform {platform.name} not in platforms([{listed}])")
                )
                dropped.append(item)
                continue
            self.requests[item.nodeid] = request
            keep.append(item)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = keep
        try:
            self._quarantine(keep)
        except DevpoolError as exc:
            raise pytest.UsageError(str(exc)) from None
        self.estimates = self._read_history()
        if self.shard is not None:
            self._keep_shard(config, items)
        self.failed_before = _failed_before(config)

    def _read_history(self) -> dict[str, float]:
        """p90 durations of earlier runs; a damaged history is a warning, not a failed run.

        Pending per-run files of shard runs are never read as estimates: a run that is
        not a shard folds them into the history first; a shard splits from the history alone.
        """
        fold = self.shard is None and bool(pending_files(self.history_path))
        if not self.history_path.exists() and not fold:
            return {}
        try:
            with History(self.history_path) as history:
                if fold:
                    history.merge_pending()
                return history.estimates()
        except DevpoolError as exc:
            self.quarantine_notes.append(f"duration history not used: {exc}")
            return {}

    def _keep_shard(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """--devpool-shard K/N: keep the tests of shard K, split by estimated device-seconds."""
        assert self.shard is not None
        k, n = self.shard
        default = self.settings.default_estimate
        capacity = shards.shard_capacity(self.inventory.platform, self.settings.memory_reserve)
        pieces = [
            shards.shard_item(
                item.nodeid,
                self.requests[item.nodeid],
                self.estimates.get(item.nodeid, default),
                by_module=self.settings.shard_by_module,
                capacity=capacity,
            )
            for item in items
        ]
        split = shards.split_suite([item.nodeid for item in items], pieces, n)
        chosen = split.members(k)
        # The record gets the whole split right after session_start, for `devpool shard verify`.
        self.listeners.append(
            shards.SplitStamp(
                k,
                split,
                self.emit,
                lambda: self.items,
                history=str(self.history_path),
                pending=str(pending_dir(self.history_path) / f"{self.run_id}.jsonl"),
            )
        )
        others = [item for item in items if item.nodeid not in chosen]
        if others:
            config.hook.pytest_deselected(items=others)
            items[:] = [item for item in items if item.nodeid in chosen]

    def _quarantine(self, items: list[pytest.Item]) -> None:
        platform = self.inventory.platform
        entries = entries_from_table(self.settings.quarantine, "[tool.devpool.quarantine]")
        if self.settings.quarantine_file is not None:
            entries += entries_from_file(self.settings.quarantine_file)
        book = Quarantine(entries, platform.name, platform.kind)
        for item in items:
            entry = book.find(item)
            if entry is not None:
                self.quarantined[item.nodeid] = entry
        today = dt.date.today()
        stale = {e.key: e for e in [*entries, *self.quarantined.values()] if e.expired(today)}
        for entry in stale.values():
            text = (
                f"quarantine of {entry.key} expired on {entry.until} ({entry.describe()}; "
                f"{entry.source})"
            )
            if self.settings.strict_quarantine:
                raise DevpoolError(text + "; renew or remove it (--devpool-strict-quarantine)")
            self.quarantine_notes.append(text)
        for entry in book.unmatched():
            self.quarantine_notes.append(
                f"quarantine entry {entry.key!r} ({entry.source}) matches no collected test"
            )

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool | None:
        if session.config.option.collectonly:
            return None
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
        default = self.settings.default_estimate
        jobs = self._jobs(session.items)
        if self.settings.repeat == 1:
            chains.tie(jobs, self.items)
        if self.settings.backend == "local" and any(j.request.device_memory for j in jobs):
            self.memory = memory.capacity_of(self.inventory, self.settings.memory_reserve)
        plan = build_plan(
            jobs,
            self.inventory,
            backend=self.settings.backend,
            estimate=lambda job: self.estimates.get(job.nodeid, default),
            memory=self.memory,
        )
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        for note in plan.notes:
            if terminal is not None:
                terminal.write_line(f"devpool: {note}")
        backend = self.make_backend(session.config)
        check = getattr(backend, "unsatisfiable", None)
        if check is not None:  # the cluster's real shape: nodes, devices per node
            for job in list(plan.jobs):
                reason = check(job.request)
                if reason is not None:
                    plan.jobs.remove(job)
                    plan.unsatisfiable.append((job, reason))
        for job in plan.jobs:
            job.estimate_known = job.nodeid in self.estimates
        if self.settings.plan:
            self._print_plan(plan)
            backend.close()
            return True
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # With --devpool-repeat, progress counts every repetition.
        session.testscollected = len(plan.jobs) + len(plan.unsatisfiable)
        self._start_record(session, plan)
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        if terminal is not None:
            terminal.showfspath = False  # reports arrive interleaved across files
        if self.github is not None and terminal is not None:
            # pytest prints captured test output (FAILURES, -rP) as it is: fence the whole
            # run so no line a test printed can act as a workflow command.
            terminal.write_line(self.github.open_fence())
        loop = Loop(self, session, plan, backend)
        live = None
        if terminal is not None and progress.wanted(self.config.option):
            live = progress.LiveProgress(terminal._tw)
        with _sigterm_as_interrupt(), live or nullcontext():
            loop.live = live
            self.loop_ran = True
            loop.run()
        if session.shouldfail:
            raise session.Failed(session.shouldfail)
        if session.shouldstop:
            raise session.Interrupted(session.shouldstop)
        return True

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(
        self, report: pytest.TestReport, config: pytest.Config
    ) -> tuple[str, str, tuple[str, Mapping[str, bool]]] | None:
        outcome = getattr(report, "devpool_outcome", None)
        if outcome in (Outcome.TIMEOUT, Outcome.CRASHED, Outcome.INFRA) and report.failed:
            word = str(outcome).upper()
            return outcome, word[0], (word, {"red": True})
        if outcome == RERUN:
            return "rerun", "R", ("RERUN", {"yellow": True})
        if getattr(report, "devpool_quarantined", False):
            return "quarantined", "Q", ("QUARANTINED", {"yellow": True})
        if outcome == Outcome.FLAKY and report.when == "call":
            return "flaky", "K", ("FLAKY", {"red": report.failed, "yellow": not report.failed})
        return None

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
        for note in self.quarantine_notes:
            terminalreporter.write_line(f"devpool: WARNING: {note}", red=True, bold=True)
        if self.quarantine_failures:
            terminalreporter.write_sep(
                "-", f"devpool: {len(self.quarantine_failures)} quarantined, failed, not gating"
            )
            for trouble in self.quarantine_failures:
                entry = self.quarantined.get(trouble.nodeid.split("[")[0])
                why = f" — {entry.describe()}" if entry else ""
                terminalreporter.write_line(
                    f"{trouble.outcome.value.upper():8} {trouble.nodeid}{why}  log: {trouble.log}"
                )
        for nodeid in self.releasable:
            terminalreporter.write_line(
                f"devpool: {nodeid} is quarantined but passed its last {RELEASE_AFTER} runs: "
                "ready to release"
            )
        for device, why in self.bad_devices.items():
            terminalreporter.write_line(
                f"devpool: device {self.inventory.platform.name}:{device} retired: {why}",
                red=True,
                bold=True,
            )
        for note in self.device_notes:
            terminalreporter.write_line(f"devpool: device {note}", yellow=True)
        for note in self.run_notes:
            terminalreporter.write_line(f"devpool: {note}", yellow=True)
        if self.deselected:
            terminalreporter.write_sep("-", f"devpool: {len(self.deselected)} deselected")
            for nodeid, reason in self.deselected:
                terminalreporter.write_line(f"{nodeid}: {reason}")
        if self.github is not None:
            terminalreporter.write_line(self.github.close_fence())
            for line in self.github.groups():
                terminalreporter.write_line(line)
        # The summary stays outside every group: it is what a reader of a collapsed log sees.
        print_repeats(terminalreporter, self.repeats)
        print_summary(terminalreporter, self.troubles, self.config.invocation_params.dir)
        if self.github is not None:
            for line in self.github.annotations():
                terminalreporter.write_line(line)
        if self.record is not None:
            terminalreporter.write_line(f"devpool: run record {self.record_path}")

    # ---- helpers --------------------------------------------------------------------------

    def _jobs(self, items: list[pytest.Item]) -> list[Job]:
        jobs = []
        for index, item in enumerate(items):
            request = self.requests.get(item.nodeid) or request_for(
                item, self.settings.platforms, self.settings.device_memory
            )
            if request.nodes > 1 and not request.isolate:
                # A multi-node test's ranks serve that test alone: never batched nor reused.
                request = replace(request, isolate=True)
            if request.timeout is None and self.settings.test_timeout is not None:
                request = replace(request, timeout=self.settings.test_timeout)
            repeat = self.settings.repeat
            uses: dict[int, int] = {}  # shared by the repeats: spread them over the devices
            for turn in range(1, repeat + 1):
                display = item.nodeid if repeat == 1 else _repeat_id(item.nodeid, turn, repeat)
                jobs.append(
                    Job(
                        index * repeat + turn - 1,
                        item.nodeid,
                        item.location,
                        request,
                        index,
                        display=display,
                        device_uses=uses,
                        failed_before=item.nodeid in self.failed_before,
                    )
                )
        return jobs

    def _print_plan(self, plan: Plan) -> None:
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        write = terminal.write_line if terminal is not None else print
        write(f"devpool plan: {len(plan.jobs)} jobs on {self.inventory.describe()}")
        for order, job in enumerate(plan.jobs, 1):
            write(f"{order:5}  {job.request.describe():28}  {job.nodeid}")
        for job, reason in plan.unsatisfiable:
            action = "skip" if self.settings.skip_unsatisfiable else "fail"
            write(f"{action:>5}  {job.request.describe():28}  {job.nodeid}: {reason}")


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """A CI step timeout sends SIGTERM: end the run as Ctrl-C would, workers and leases freed."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _failed_before(config: pytest.Config) -> set[str]:
    """Node ids that failed last time, when --ff or --lf asks for failures first."""
    option = config.option
    cache = getattr(config, "cache", None)
    if cache is None or not (getattr(option, "lf", False) or getattr(option, "failedfirst", False)):
        return set()
    lastfailed = cache.get("cache/lastfailed", {})
    return set(lastfailed) if isinstance(lastfailed, dict) else set()


def _junit_keys(
    retried: Mapping[str, list[Attempt]], prefix: str | None
) -> dict[tuple[str, str], list[Attempt]]:
    """(classname, name) as pytest's junitxml derives them from a node id."""
    from _pytest.junitxml import mangle_test_address

    keys = {}
    for nodeid, attempts in retried.items():
        names = mangle_test_address(nodeid)
        if prefix:
            names[0] = f"{prefix}.{names[0]}"
        keys[(".".join(names[:-1]), names[-1])] = attempts
    return keys


def _repeat_id(nodeid: str, turn: int, total: int) -> str:
    """pytest-repeat's spelling: test_a[3-20], test_b[x-3-20]."""
    if nodeid.endswith("]"):
        return f"{nodeid[:-1]}-{turn}-{total}]"
    return f"{nodeid}[{turn}-{total}]"
