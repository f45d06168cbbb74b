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

from devpool import __version__
from devpool.config import Settings
from devpool.errors import DevpoolError
from devpool.folders import devpool_dir
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
from devpool.select.diff import Current, Selection, select
from devpool.select.fingerprints import project_rel
from devpool.select.options import SelectOptions
from devpool.select.policy import auto_mode
from devpool.select.record import DEPS_ATTR
from devpool.select.tables import expand

_RANK = {"passed": 0, "skipped": 1, "failed": 2}


def store_for(root: Path) -> Store:
    """The project's baseline store: <rootdir>/.devpool/select."""
    return Store(devpool_dir(root) / "select")


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
        self.store = store_for(self.root)
        self.selection: Selection | None = None
        self.builder = Builder(self.root, own_folders(self.root, settings, controller.run_dir))
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
                counts[item.nodeid] = request_for(item, self.settings.platforms).device_count
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
        )
        self.selection = select(self.store, current)
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
        deps = getattr(report, DEPS_ATTR, None)
        if self.mode == "record" and isinstance(deps, dict):
            deps = expand(deps)
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
        if self.mode != "record" or not self.builder.tests:
            return
        try:
            self.written = self._write().name
        except (OSError, DevpoolError) as exc:
            self.write_error = f"baseline not written: {exc}"
        if self.controller.record is not None:
            self.controller.emit(
                "select_baseline",
                generation=self.written,
                error=self.write_error,
                tests=len(self.builder.tests),
            )

    def _write(self) -> Path:
        bucket = self._bucket()
        commit, dirty = source_state(self.root)
        counts: dict[str, int] = {}
        for request in self.controller.requests.values():
            key = str(request.device_count)
            counts[key] = counts.get(key, 0) + 1
        manifest = {
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
        hashes = library_hashes(self.store.path, self.builder.library_paths())
        return self.store.write(manifest, self.builder.database(hashes))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        write = terminalreporter.write_line
        if self.policy:
            write(f"devpool select: {self.policy}")
        if self.selection is not None:
            mode = " (shadow: everything ran)" if self.mode == "shadow" else ""
            write(f"devpool select{mode}: {self.selection.summary()}")
            for nodeid in self.misses:
                write(
                    f"devpool select: MISS {nodeid} failed but would not have been selected",
                    red=True,
                )
        if self.written:
            write(
                f"devpool select: recorded baseline {self.written} "
                f"({len(self.builder.tests)} tests)"
            )
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
    if settings.select == "record" and settings.shard is not None:
        raise DevpoolError("--devpool-select record does not combine with --devpool-shard yet")
    controller = config.pluginmanager.get_plugin("devpool-controller")
    session = SelectSession(config, settings, select_options(table, where), controller)
    config.pluginmanager.register(session, "devpool-select")
