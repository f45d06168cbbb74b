"""In the worker: what each test depended on, sent with its teardown report.

While a test runs (setup, call, teardown) a watch (watch.py) notes every code object
entered; at teardown those become spots, where code of the project's own files starts,
which the controller turns into blocks (fingerprints.py, baseline.Builder), off the
workers' path. Added to them: the top of every project module loaded in this process, the
shared libraries mapped (/proc/self/maps), the files inside the rootdir opened for reading
(an audit hook on "open") and the files named by depends_on globs. The report carries them
as `devpool_deps`; pytest's serialization keeps such extra attributes, so the controller
reads them from the replayed report. Workers write nothing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Generator, Iterable
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any

import pytest

from devpool.config import read_table
from devpool.errors import DevpoolError
from devpool.project import option_value
from devpool.select import children
from devpool.select.fingerprints import LoadedLibraries, ProjectPaths, file_hash, library_stamp
from devpool.select.options import mode_of, select_options
from devpool.select.own_hooks import PACKAGE, OwnHooks
from devpool.select.policy import auto_mode
from devpool.select.tables import SentTables
from devpool.select.watch import (
    Codes,
    Watch,
    data_read,
    module_spots,
    spots_of,
    watch_for_this_interpreter,
)

DEPS_ATTR = "devpool_deps"


class Recorder:
    """The worker-side plugin of `--devpool-select record`."""

    def __init__(self, root: Path, watch: Watch | None = None) -> None:
        self.root = root
        # A library inside the rootdir is named relative to it (see _libraries).
        self.libraries = LoadedLibraries(lambda path: self.paths.rel(path) or path)
        self.tables = SentTables()
        self.watch = watch
        self.codes: Codes = {}  # where the running code is noted: test or fixture
        self.outer: list[Codes] = []  # the sets around a fixture being set up
        self.fixture_codes: dict[int, Codes] = {}  # id(FixtureDef) → its setup's code
        # Code that ran before the first test (collection: imports, conftest hooks) or while
        # a module was imported during a test: every later test may use what it built.
        self.import_codes: Codes = {}
        self.tested = False  # a test has started: what ran before it was collection
        self.reads: set[str] = set()
        self.active = False
        self.paused = True  # devpool stopped watching: reports, and between tests
        self.lost = ""  # why the running test cannot be recorded; "" while it can
        self.paths = ProjectPaths(root)
        self._hashes: dict[tuple[str, int, int], str | None] = {}
        self._items: dict[str, pytest.Item] = {}
        self._on_exec: Callable[[str, tuple[Any, ...]], None] | None = None
        # What is kept between tests: the shared spots, with the count of import codes and
        # the modules they were found from.
        self._shared_of: tuple[int, list[ModuleType]] = (-1, [])
        self._shared: list[tuple[str, int]] = []
        self._shared_set: set[tuple[str, int]] = set()
        self._merged: dict[tuple[int, tuple[str, ...]], dict[str, Any]] = {}  # with_libraries
        self.below = children.Below(root)  # what the processes a test starts ran
        self.own = OwnHooks(lambda on: self._switch(on, own=True))
        sys.addaudithook(self._audit)

    # ---- what the watch saw, and the files ------------------------------------------------

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        if event == "exec" and self._on_exec is not None:
            self._on_exec(event, args)
        elif event == "open" and self.active and (name := data_read(args)) is not None:
            self.reads.add(name)

    def install(self) -> None:
        """Watch from now on with the cheapest free hook (watch.py). With every hook taken
        nothing is recorded, and every test always runs."""
        children.hand_over()  # a process below a recording worker records tests itself
        if self.watch is None:
            self.watch = watch_for_this_interpreter(self._watched)
        self._on_exec = getattr(self.watch, "audit", None)  # one audit hook: this one
        self._resume()

    def _watched(self, filename: str) -> bool:
        """Whether code of this file becomes blocks: the project's Python files."""
        return self.paths.source(filename) is not None

    def _collect(self) -> None:
        """Move what the watch saw into the running set (test or fixture)."""
        if self.watch is not None:
            codes, imported = self.watch.take()
            self.codes |= codes
            self.import_codes |= imported

    def _pause(self) -> None:
        """Stop watching while reports are handled and between tests: each watched call
        costs, and none of that code is the test's."""
        if not self.paused:
            self._switch(on=False)
            self.paused = True

    def _resume(self) -> None:
        """Watch again; a hook found in devpool's place means the test is not recorded."""
        if self.paused:
            self.paused = False
            self._switch(on=True)

    def _switch(self, on: bool, own: bool = False) -> None:
        """Turn the watch on or off; off all through devpool's own hooks (own_hooks.py)."""
        if self.paused or not (own or self.own.watching()):
            return
        if self.watch is None:
            self.lost = self.lost or "every hook that could watch the code was taken"
        else:
            self.lost = self.lost or (self.watch.start() if on else self.watch.stop())

    # ---- pytest hooks ---------------------------------------------------------------------

    def pytest_runtest_logstart(self, nodeid: str, location: object) -> None:
        self._collect()  # collection, the first time; else nothing (paused between tests)
        if not self.tested:
            self.import_codes |= self.codes
            self.tested = True
        self.codes, self.outer, self.reads = {}, [], set()
        self.lost = ""
        self.below.begin(self.watch)
        self._resume()
        self.active = True

    def pytest_sessionfinish(self) -> None:
        self.below.end()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        # A plugin may run a test again after its teardown report without a new logstart.
        self._resume()
        self.active = True

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: Any, request: Any) -> Generator[None, Any, Any]:
        """A fixture's setup runs once for all the tests that share it: note its code apart.
        A function-scoped one runs again for each test, so its code is the test's anyway."""
        if fixturedef.scope == "function":
            return (yield)
        self._collect()
        self.outer.append(self.codes)
        self.codes = {}
        try:
            return (yield)
        finally:
            self._collect()
            inner, self.codes = self.codes, self.outer.pop()
            self.codes |= inner
            self.fixture_codes.setdefault(id(fixturedef), {}).update(inner)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> Generator[None, Any, Any]:
        """Every plugin handles a report untraced; the teardown report gets the test's
        dependencies before the worker serializes it, and tracing stays off until the next
        test starts."""
        self._pause()
        if report.when == "teardown":
            self._collect()
            self.active = False
            setattr(report, DEPS_ATTR, self._deps(report.nodeid))
        try:
            return (yield)
        finally:
            if report.when != "teardown":
                self._resume()

    def _deps(self, nodeid: str) -> dict[str, Any]:
        why = self.lost
        item = self._items.get(nodeid)
        if item is not None and type(item).__name__ == "DoctestItem":
            why = "a doctest: its examples are text no trace sees"
        borrowed = self._borrowed(item)
        for name, once in borrowed:
            if not why and not once.get("recorded"):
                why = f"once-fixture {name}'s process recorded no code ({once.get('why')})"
        below = self.below.gather()
        deps: dict[str, Any] = {"nodeid": nodeid, "recorded": not why, "why": why}
        if not why:
            self._attach(deps, item, [once for _, once in borrowed], below)
        return deps

    def _borrowed(self, item: pytest.Item | None) -> list[tuple[str, dict[str, Any]]]:
        """What the test's once-fixtures ran in their own process (worker/once.py)."""
        once = item.config.pluginmanager.get_plugin("devpool-once") if item is not None else None
        recorded = getattr(once, "recorded", None)
        return recorded(item) if recorded is not None else []

    def _attach(
        self,
        deps: dict[str, Any],
        item: pytest.Item | None,
        borrowed: list[dict[str, Any]],
        below: children.Gathered,
    ) -> None:
        """Add the fingerprints of what the test ran and read to its deps, of what its
        once-fixtures ran and read in their own process, and of what the processes it
        started ran and read."""
        codes = dict(self.codes)  # import_codes: their blocks are the shared ones
        markers = item.iter_markers("depends_on") if item is not None else ()
        globs = [str(g) for marker in markers for g in marker.args]
        if item is not None:  # fixtures it uses that an earlier test set up
            info = getattr(item, "_fixtureinfo", None)
            for fixturedefs in getattr(info, "name2fixturedefs", {}).values():
                for fixturedef in fixturedefs:
                    codes |= self.fixture_codes.get(id(fixturedef), {})
        own = [str(item.path)] if item is not None and item.path.suffix != ".py" else []
        shared = self._shared_spots()
        spots = self._spots(codes.values())
        files = self._files(globs, own)
        libs = self._libraries()
        spots |= below.spots
        files.update(below.files)
        unseen = [below.why]  # a process below told nothing: any change selects the test
        for once in borrowed:
            spots.update((str(rel), int(line)) for rel, line in once["spots"])
            files.update(once["files"])
            libs = with_libraries(libs, once["libs"], self._merged)
            unseen.append(once.get("unseen", ""))
        deps["unseen"] = next(filter(None, unseen), "")
        deps.update(
            # Where the code that ran starts; the controller turns spots into blocks.
            spots=sorted(spots - self._shared_set),
            # A test collected from a non-Python file (YAML, .txt) depends on that file.
            files=files,
            globs=globs,
            # The same for most tests of this worker: sent once (tables.py).
            **self.tables.refer("shared_spots", shared),
            **self.tables.refer("libs", libs),
        )

    # ---- a once-fixture's own process (worker/once.py) ------------------------------------

    def once_begin(self) -> None:
        """A once-fixture's setup starts: what ran before is collection's."""
        self._collect()
        self.import_codes |= self.codes
        self.codes, self.reads, self.active = {}, set(), True
        self.below.begin(self.watch)
        self._resume()

    def once_deps(self) -> dict[str, Any]:
        """What a once-fixture's setup ran and read, with everything its process ran before
        it (its collection, the top of each module loaded): the dependencies of every test
        that uses it ({"recorded": False, "why"} where the process could not record)."""
        self._pause()
        self._collect()
        self.active = False
        below = self.below.gather()
        if self.lost:
            return {"recorded": False, "why": self.lost}
        codes = dict(self.import_codes) | self.codes
        for fixture in self.fixture_codes.values():
            codes |= fixture
        spots = self._spots(codes.values()) | set(self._shared_spots()) | below.spots
        return {
            "recorded": True,
            "spots": sorted(spots),
            "files": self._files([], []) | below.files,
            "libs": self._libraries(),
            "unseen": below.why,
        }

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self._items = {item.nodeid: item for item in session.items}
        # What collection ran counts for every test. Taken now, a fork server's template
        # hands this work done to its workers.
        self._collect()
        self.import_codes |= self.codes
        self.codes = {}
        self._shared_spots()

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, Any, Any]:
        """From here to the first test runs the run's machinery (a fork server's loop, a
        worker becoming one), no test's: not watched. What ran since collection finished
        still counts for every test (the first test's start takes it)."""
        self._collect()
        self._pause()
        return (yield)

    # ---- turning what was seen into fingerprints ------------------------------------------

    def _spots(self, codes: Iterable[CodeType]) -> set[tuple[str, int]]:
        return spots_of(codes, self.paths.source)

    def _shared_spots(self) -> list[tuple[str, int]]:
        """The spots of code that ran at import, and the top level of every project module
        loaded in this process: every test may depend on them. Found again only when either
        has grown."""
        modules = list(sys.modules.values())
        if len(self.import_codes) != self._shared_of[0] or modules != self._shared_of[1]:
            spots = self._spots(self.import_codes.values()) | module_spots(
                modules, self.paths.source
            )
            self._shared_of = (len(self.import_codes), modules)
            if spots != self._shared_set:  # a new list: tables.py names it anew
                self._shared, self._shared_set = sorted(spots), spots
        return self._shared

    def _files(self, globs: list[str], own: list[str]) -> dict[str, str | None]:
        paths = {p for p in [*self.reads, *own] if os.path.isfile(p)}
        for pattern in globs:
            paths.update(str(p) for p in self.root.glob(pattern) if p.is_file())
        files: dict[str, str | None] = {}
        for path in paths:
            rel = self.paths.rel(path)
            if rel is not None:
                files[rel] = self._hash(path)
        return files

    def _libraries(self) -> dict[str, tuple[int, int] | None]:
        """Mapped libraries by path; one inside the rootdir by its path relative to it.

        A Ray worker with shipped code has its rootdir elsewhere: the controller resolves a
        relative path against its own rootdir (baseline.Builder)."""
        return self.libraries.stamps()

    def _hash(self, path: str) -> str | None:
        stamp = library_stamp(path)
        if stamp is None:
            return None
        key = (path, *stamp)
        if key not in self._hashes:
            self._hashes[key] = file_hash(Path(path))
        return self._hashes[key]


def with_libraries(
    libs: dict[str, Any], more: dict[str, Any], merged: dict[tuple[int, tuple[str, ...]], Any]
) -> dict[str, Any]:
    """libs with a once-fixture's libraries too; the same object while nothing is new (a
    table is sent again only when it changes), and one merged table kept in `merged`."""
    stamps = {path: tuple(stamp) if stamp is not None else None for path, stamp in more.items()}
    if all(path in libs and libs[path] == stamp for path, stamp in stamps.items()):
        return libs
    key = (id(libs), tuple(sorted(stamps)))
    if key not in merged:
        merged.clear()
        merged[key] = {**libs, **stamps}
    return merged[key]  # type: ignore[no-any-return]


_EARLY: Recorder | None = None  # started before the initial conftests were imported


def start_early(early_config: pytest.Config, args: list[str]) -> None:
    """In a worker of a record run, watch imports from before the first conftest loads.

    Called from pytest_load_initial_conftests: what a conftest's imports run at import
    time (a module-level `CONFIG = load()`) counts for every test of the worker."""
    global _EARLY
    if not any(a == "--devpool-worker" or a.startswith("--devpool-worker=") for a in args):
        return
    inipath = early_config.inipath
    if inipath is None or inipath.name != "pyproject.toml":
        inipath = early_config.rootpath / "pyproject.toml"
    try:
        table = read_table(inipath)
    except DevpoolError:
        table = {}  # the controller has said so already
    if (
        worker_mode(option_value(args, "--devpool-select"), table, early_config.rootpath)
        == "record"
    ):
        _EARLY = Recorder(early_config.rootpath)
        _EARLY.install()


def worker_mode(option: str | None, table: dict[str, Any], root: Path) -> str:
    """The select mode of this run as the controller resolved it (auto: by the same rule)."""
    mode = mode_of(option, table)
    if mode == "auto":
        try:
            full_on = select_options(table, "pyproject.toml").full_on
        except DevpoolError:
            return "off"  # the controller has refused the table already
        mode = auto_mode(full_on, os.environ, root)[0]
    return mode


def register_worker(config: pytest.Config, option: str | None, table: dict[str, Any]) -> None:
    """In a worker of a `--devpool-select record` run: record each test's dependencies."""
    if worker_mode(option, table, config.rootpath) != "record":
        return
    recorder = _EARLY
    if recorder is None or recorder.root != config.rootpath:
        recorder = Recorder(config.rootpath)
        recorder.install()
    config.pluginmanager.register(recorder, "devpool-select-recorder")
    if recorder.paths.source(str(PACKAGE / "__init__.py")) is not None:
        recorder.own.wrap_all(config.pluginmanager)  # devpool is this project: its own suite
