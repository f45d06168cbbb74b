"""The controller's side of selective runs: select before the run, write baselines after.

`record`: every worker report's dependencies (record.py) go into one new generation at
the end of the session; the controller alone writes it. `on`: only the selected tests
run, or all of them with the reason when the baseline cannot be trusted. `shadow`: all
run, and the failures selection would have missed are listed.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from devpool.config import Settings
from devpool.errors import DevpoolError
from devpool.plan.markers import request_for
from devpool.select.baseline import (
    SCHEMA,
    Bucket,
    Builder,
    Store,
    bucket_of,
    compatibility_inputs,
    identity,
    library_hashes,
    source_state,
)
from devpool.select.diff import BaselineStore, Current, Selection, select
from devpool.select.fingerprints import project_rel
from devpool.select.fleet import JobPart, pool_mark
from devpool.select.location import baseline_store, store_for
from devpool.select.options import SelectOptions
from devpool.select.policy import auto_mode
from devpool.select.record import DEPS_ATTR
from devpool.select.tables import expand
from devpool.version import __version__

_RANK = {"passed": 0, "skipped": 1, "failed": 2}


def recording_run(settings: Settings, mode: str) -> str | None:
    """The run a job belongs to where selection spans jobs: the queue's run (a queue's jobs
    select alike; they record one baseline), or the shards' CI run (--devpool-queue-run,
    else GitHub's run and attempt; "shards" for files); None for a run of its own."""
    from devpool.history.location import HistoryUrl
    from devpool.queue.source import run_id_from

    if settings.queue is not None:
        return run_id_from(settings.queue_run, os.environ)
    if settings.shard is None or mode != "record":
        return None
    if settings.queue_run or not isinstance(settings.history, HistoryUrl):
        return settings.queue_run or "shards"
    if os.environ.get("GITHUB_RUN_ID") and os.environ.get("GITHUB_RUN_ATTEMPT"):
        return run_id_from(None, os.environ)
    raise DevpoolError(
        "--devpool-select record with --devpool-shard sends each shard's part to the "
        "database: set --devpool-queue-run=ID, the same in every shard of the CI run"
    )


def own_folders(root: Path, settings: Settings, run_dir: Path) -> tuple[str, ...]:
    """devpool's own folders inside the project, as 'rel/' prefixes: what a test reads
    there (its devpool_artifacts, a log) is devpool's output, no input of the test."""
    folders = [run_dir, settings.lock_dir]
    if settings.run_record is not None:
        folders.append(settings.run_record.parent)
    found = []
    for folder in folders:
        rel = project_rel(root, str(folder.resolve()))
        if rel is not None and rel not in ("", "."):
            found.append(rel.rstrip("/") + "/")
    return tuple(found)


class SelectSession:
    """The controller-side plugin of --devpool-select record|on|shadow."""

    def __init__(
        self, config: pytest.Config, settings: Settings, options: SelectOptions, controller: Any
    ) -> None:
        self.config = config
        self.settings = settings
        self.options = options
        self.controller = controller
        self.mode = settings.select
        self.policy = ""  # with auto: which mode it chose, and why
        if self.mode == "auto":
            self.mode, self.policy = auto_mode(options.full_on, os.environ, config.rootpath)
        self.root = config.rootpath
        self.store: BaselineStore = baseline_store(settings.history, self.root, options.keep)
        self.selection: Selection | None = None
        self.builder = Builder(self.root, own_folders(self.root, settings, controller.run_dir))
        # A recording spread over jobs (queue, shards): this job's part, and the run's name.
        self.run = recording_run(settings, self.mode)
        self.part = JobPart(self.root, self.builder, store_for(self.root).path)
        self.published_note = ""
        self.warming: threading.Thread | None = None
        self.outcomes: dict[str, str] = {}  # display id → worst phase outcome so far
        self.misses: list[str] = []
        self.written: str | None = None
        self.write_error: str | None = None
        controller.listeners.append(self)

    def _bucket(self) -> Bucket:
        option = self.config.option
        return bucket_of(
            self.root,
            self.config.invocation_params.dir,
            [str(a) for a in self.config.args],
            getattr(option, "markexpr", "") or "",
            getattr(option, "keyword", "") or "",
        )

    def _inifile(self) -> str | None:
        inipath = self.config.inipath
        if inipath is None:
            return None
        try:
            return inipath.relative_to(self.root).as_posix()
        except ValueError:
            return str(inipath)

    def _devices(self, items: list[pytest.Item]) -> dict[str, int]:
        counts = {}
        for item in items:
            try:
                counts[item.nodeid] = request_for(
                    item,
                    self.settings.platforms,
                    self.settings.device_memory,
                    self.settings.resources,
                ).device_count
            except DevpoolError:
                counts[item.nodeid] = -1  # the controller names the bad marker itself
        return counts

    # ---- before the run ---------------------------------------------------------------------

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        """After -k, -m and every conftest's own selection: keep what the change can affect."""
        if self.mode not in ("on", "shadow"):
            return
        current = Current(
            root=self.root,
            bucket=self._bucket(),
            options=self.options,
            identity=identity(self.options.key_packages),
            rev=self.settings.select_base,
            platform=self.controller.inventory.platform.name,
            inifile=self._inifile(),
            devices=self._devices(items),
            pool=len(self.controller.inventory.devices),
            pin=self.run if self.settings.queue else None,
        )
        self.selection = select(self.store, current)
        if self.settings.queue and self.run is not None:
            from devpool.select.queued import tell_queue

            tell_queue(self.settings.queue, self.run, self.selection, self.mode, len(items))
        if self.mode != "on" or self.selection.full_reason is not None:
            return
        keep = [item for item in items if item.nodeid in self.selection.selected]
        dropped = [item for item in items if item.nodeid not in self.selection.selected]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = keep

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """A recording run: parse the project's files the tests imported while the workers
        start and run, so that no report waits on it (baseline.Builder.warm)."""
        if self.mode == "record":
            files = [getattr(module, "__file__", None) for module in list(sys.modules.values())]
            self.warming = threading.Thread(
                target=self.builder.warm,
                args=([f for f in files if isinstance(f, str)],),
                name="devpool-select-warm",
                daemon=True,
            )
            self.warming.start()

    def event(self, event_type: str, fields: Any) -> None:
        """The run record's select line, right after its session_start line."""
        if event_type != "session_start":
            return
        source = self.config.pluginmanager.get_plugin("devpool-queue")
        if self.mode == "record" and source is not None:
            # each test's dependencies reach the database before its outcome reaches the queue
            source.before_flush.append(self._send_part)
        if self.selection is not None:
            fields = self.selection.as_event()
            self.controller.emit("select", mode=self.mode, policy=self.policy, **fields)
        elif self.mode == "record":
            reason = self.policy or "recording"
            self.controller.emit(
                "select", mode=self.mode, policy=self.policy, full_run=True, reason=reason
            )

    # ---- during the run -----------------------------------------------------------------------

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        outcome: str = report.outcome if report.outcome in ("passed", "skipped") else "failed"
        before = self.outcomes.get(report.nodeid, "passed")
        if _RANK[outcome] > _RANK[before]:
            self.outcomes[report.nodeid] = outcome
        else:
            self.outcomes.setdefault(report.nodeid, before)
        if report.failed and self.mode == "shadow" and self.selection is not None:
            missed = report.nodeid not in self.selection.selected
            if self.selection.full_reason is None and missed and report.nodeid not in self.misses:
                self.misses.append(report.nodeid)
        if report.when != "teardown":
            return
        outcome = self.outcomes.pop(report.nodeid, "passed")
        if self.mode != "record":
            return
        deps = getattr(report, DEPS_ATTR, None)
        if isinstance(deps, dict):
            deps = expand(deps)
        elif report.nodeid in self.controller.requests:
            # Its worker sent none (it was lost, or ended the test): in the baseline all the
            # same, so that the next selective run and `devpool select` say why it runs.
            why = "its worker sent no dependencies (lost, or the test was ended)"
            deps = {"nodeid": report.nodeid, "recorded": False, "why": why}
        else:
            return
        request = self.controller.requests.get(deps.get("nodeid"))
        self.builder.add(deps, outcome, request.device_count if request else 0)

    # ---- after the run ------------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Write the new generation (record mode) while the run record is still open."""
        selection = self.selection
        kept_none = (
            self.mode == "on"
            and selection is not None
            and selection.full_reason is None
            and bool(selection.deselected)
        )
        if kept_none and session.exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
            # Nothing a change can affect is not "nothing collected": CI stays green.
            session.exitstatus = pytest.ExitCode.OK
        if self.mode == "shadow" and self.controller.record is not None:
            self.controller.emit("select_misses", misses=list(self.misses))
        if self.warming is not None:
            self.warming.join()
        if self.mode != "record" or not (self.builder.tests or self.settings.queue):
            return
        try:
            if self.settings.queue and self.run is not None:
                self.written = self._publish_queue_run(self.run)
            elif self.settings.shard is not None:
                from devpool.select.shards import write_part

                shard = self.controller.shard  # (index, count), parsed by the controller
                self.published_note = write_part(
                    self.store, self.run, shard, self._manifest(), self.part
                )
            else:
                written = self.store.write(self._manifest(), self._database())
                self.written = written.name if isinstance(written, Path) else written
        except (OSError, DevpoolError) as exc:
            # A generation in the database is published whole or not at all; a file is written.
            done = "written" if isinstance(self.store, Store) else "published"
            self.write_error = f"baseline not {done}: {exc}"
        finally:
            close = getattr(self.store, "close", None)
            if close is not None:
                close()  # the connection this job sent its parts on
        if self.controller.record is not None:
            self.controller.emit(
                "select_baseline",
                generation=self.written,
                error=self.write_error,
                tests=len(self.builder.tests),
            )

    def _manifest(self) -> dict[str, Any]:
        bucket = self._bucket()
        commit, dirty = source_state(self.root)
        counts: dict[str, int] = {}
        for request in self.controller.requests.values():
            key = str(request.device_count)
            counts[key] = counts.get(key, 0) + 1
        return {
            "schema": SCHEMA,
            "devpool": __version__,
            "platform": self.controller.inventory.platform.name,
            "bucket": bucket.as_dict(),
            "shape": {
                "pool": len(self.controller.inventory.devices),
                "device_counts": counts,
            },
            "identity": identity(self.options.key_packages),
            "inifile": self._inifile(),
            "compat": compatibility_inputs(self.root, bucket, self.options, self._inifile()),
            "commit": commit,
            "dirty": dirty,
        }

    def _database(self) -> dict[str, Any]:
        hashes = library_hashes(store_for(self.root).path, self.builder.library_paths())
        return self.builder.database(hashes)

    def _send_part(self) -> None:
        """This job's tests recorded since the last send, to the run's part in the database."""
        from devpool.select.store_pg import PgStore

        if isinstance(self.store, PgStore) and self.run is not None:
            if not self.part.marks:  # this job's runner shape, said with every batch
                inventory = self.controller.inventory
                self.part.marks = pool_mark(inventory.platform.name, len(inventory.devices))
            self.part.send(self.store, self.run)

    def _publish_queue_run(self, run: str) -> str | None:
        """Send what is left; the job that finds the queue run complete publishes it."""
        from devpool.select.queued import publish_when_complete
        from devpool.select.store_pg import PgStore

        assert isinstance(self.store, PgStore) and self.settings.queue is not None
        self._send_part()
        if self.part.error:  # tests the queue has as ended lack their dependencies
            raise DevpoolError(
                f"queue run {run!r}: this job could not send its tests' dependencies "
                f"({self.part.error})"
            )
        name, self.published_note = publish_when_complete(
            self.store, self.settings.queue, run, self.root, self._manifest()
        )
        return name

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        write = terminalreporter.write_line
        if self.policy:
            write(f"devpool select: {self.policy}")
        if self.selection is not None:
            mode = " (shadow: everything ran)" if self.mode == "shadow" else ""
            write(f"devpool select{mode}: {self.selection.summary()}")
            if self.config.get_verbosity() > 0 and self.selection.full_reason is None:
                for nodeid, why in sorted(self.selection.selected.items()):
                    write(f"devpool select: selected {nodeid}: {why}")
            for nodeid in self.misses:
                write(
                    f"devpool select: MISS {nodeid} failed but would not have been selected",
                    red=True,
                )
        if self.written and not self.published_note:  # a queue run's note counts all its jobs
            write(
                f"devpool select: recorded baseline {self.written} "
                f"({len(self.builder.tests)} tests)"
            )
        if self.published_note:
            write(f"devpool select: {self.published_note}")
        if self.write_error:
            write(f"devpool select: WARNING: {self.write_error}", red=True)


def worker_options(config: pytest.Config) -> list[str]:
    """The mode this controller resolved, pinned for its workers: `auto` asks git, and a Ray
    worker with shipped code has no .git to ask (it would not record)."""
    session = config.pluginmanager.get_plugin("devpool-select")
    return [f"--devpool-select={session.mode}"] if isinstance(session, SelectSession) else []


def register_controller(
    config: pytest.Config, settings: Settings, table: dict[str, Any], where: str
) -> None:
    """Register the controller's select plugin for --devpool-select record|on|shadow."""
    from devpool.select.options import select_options

    if settings.select == "off":
        return
    controller = config.pluginmanager.get_plugin("devpool-controller")
    session = SelectSession(config, settings, select_options(table, where), controller)
    from devpool.history.location import HistoryUrl

    if session.mode == "record" and settings.queue and not isinstance(settings.history, HistoryUrl):
        raise DevpoolError(
            "--devpool-select record with --devpool-queue keeps the baseline beside the fleet's "
            "history: set --devpool-history=postgresql://… (the database every job reaches)"
        )
    config.pluginmanager.register(session, "devpool-select")
