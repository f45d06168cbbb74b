"""In the worker: what each test depended on, sent with its teardown report.

While a test runs (setup, call, teardown) a trace function notes every code object
entered; at teardown those become the blocks (fingerprints.py) of the project's own
files. Added to them: the top-level block of every project module loaded in this
process, the shared libraries mapped (/proc/self/maps), the files inside the rootdir
opened for reading (an audit hook on "open") and the files named by depends_on globs.
The report carries them as `devpool_deps`; pytest's serialization keeps such extra
attributes, so the controller reads them from the replayed report. Workers write nothing.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import pytest

from devpool.select.fingerprints import (
    TOP,
    BlockCache,
    file_hash,
    library_stamp,
    mapped_libraries,
    project_rel,
)

DEPS_ATTR = "devpool_deps"
_READ_FLAGS = (os.O_RDONLY, os.O_RDWR)
_NOT_DATA = (".py", ".pyc", ".so", ".pth")


class Recorder:
    """The worker-side plugin of `--devpool-select record`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.blocks = BlockCache(root)
        self.codes: set[CodeType] = set()
        self.reads: set[str] = set()
        self.active = False
        self.how = ""  # "trace" or "profile": which hook this test is recorded with
        self._rel: dict[str, str | None] = {}
        self._hashes: dict[tuple[str, int, int], str | None] = {}
        sys.addaudithook(self._audit)

    # ---- the hooks that see a test's code and files -------------------------------------

    def _trace(self, frame: FrameType, event: str, arg: Any) -> None:
        self.codes.add(frame.f_code)  # a 'call' event; no local tracing (cheap)

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            self.codes.add(frame.f_code)

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        if event != "open" or not self.active:
            return
        path, mode, flags = args
        if isinstance(path, int):
            return
        if mode is not None:
            if "r" not in mode:  # w+ and a+ read back what the test wrote itself
                return
        elif flags & os.O_ACCMODE not in _READ_FLAGS:
            return
        name = os.fsdecode(path)
        if not name.endswith(_NOT_DATA):
            self.reads.add(os.path.abspath(name))

    def _start(self) -> None:
        self.codes = set()
        self.reads = set()
        # A tracer already there (coverage.py, a debugger) keeps its hook; the profile
        # hook sees the same calls. With both taken the test is not recorded (always runs).
        if sys.gettrace() is None:
            self.how = "trace"
            sys.settrace(self._trace)
            threading.settrace(self._trace)
        elif sys.getprofile() is None:
            self.how = "profile"
            sys.setprofile(self._profile)
            threading.setprofile(self._profile)
        else:
            self.how = ""
        self.active = True

    def _stop(self) -> str:
        """Remove the hooks; '' when the test was seen whole, else why not."""
        self.active = False
        why = "" if self.how else "another tracer and profiler were both installed"
        if self.how == "trace":
            if sys.gettrace() != self._trace:
                why = "the test replaced the trace function"
            sys.settrace(None)
            threading.settrace(None)
        elif self.how == "profile":
            if sys.getprofile() != self._profile:
                why = "the test replaced the profile function"
            sys.setprofile(None)
            threading.setprofile(None)
        return why

    # ---- pytest hooks ---------------------------------------------------------------------

    def pytest_runtest_logstart(self, nodeid: str, location: object) -> None:
        self._start()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Before the worker serializes the teardown report: attach the test's dependencies."""
        if report.when != "teardown":
            return
        why = self._stop()
        item = self._item(report.nodeid)
        deps: dict[str, Any] = {"nodeid": report.nodeid, "recorded": not why, "why": why}
        if not why:
            globs = [
                str(g) for m in (item.iter_markers("depends_on") if item else ()) for g in m.args
            ]
            deps.update(
                blocks=self._blocks(),
                files=self._files(globs),
                libs={p: library_stamp(p) for p in sorted(mapped_libraries())},
                globs=globs,
            )
        setattr(report, DEPS_ATTR, deps)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self._items = {item.nodeid: item for item in session.items}

    def _item(self, nodeid: str) -> pytest.Item | None:
        return getattr(self, "_items", {}).get(nodeid)

    # ---- turning what was seen into fingerprints ------------------------------------------

    def _relpath(self, filename: str) -> str | None:
        if filename not in self._rel:
            self._rel[filename] = project_rel(self.root, filename)
        return self._rel[filename]

    def _blocks(self) -> dict[str, str]:
        found: dict[str, str] = {}
        for code in self.codes:
            rel = self._relpath(code.co_filename)
            if rel is None or not rel.endswith(".py"):
                continue
            module = self.blocks.blocks(rel)
            if module is not None:
                key = module.block_at(code.co_firstlineno)
                found[key] = module.hashes[key]
        # Module top levels run at import, before any test: every project module loaded in
        # this process may have shaped this test (constants, decorators, signatures).
        for module_object in list(sys.modules.values()):
            filename = getattr(module_object, "__file__", None)
            rel = self._relpath(filename) if isinstance(filename, str) else None
            if rel is None or not rel.endswith(".py"):
                continue
            module = self.blocks.blocks(rel)
            if module is not None:
                key = module.key(TOP)
                found[key] = module.hashes[key]
        return found

    def _files(self, globs: list[str]) -> dict[str, str | None]:
        paths = {p for p in self.reads if os.path.isfile(p)}
        for pattern in globs:
            paths.update(str(p) for p in self.root.glob(pattern) if p.is_file())
        files: dict[str, str | None] = {}
        for path in paths:
            rel = project_rel(self.root, path)
            if rel is not None:
                files[rel] = self._hash(path)
        return files

    def _hash(self, path: str) -> str | None:
        stamp = library_stamp(path)
        if stamp is None:
            return None
        key = (path, *stamp)
        if key not in self._hashes:
            self._hashes[key] = file_hash(Path(path))
        return self._hashes[key]


def register_worker(config: pytest.Config, mode: str) -> None:
    """In a worker of a `--devpool-select record` run: record each test's dependencies."""
    if mode == "record":
        config.pluginmanager.register(Recorder(config.rootpath), "devpool-select-recorder")
