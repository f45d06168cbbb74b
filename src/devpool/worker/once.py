"""A once-fixture in devpool's processes: one process of its own sets it up and tears it
down; every worker's tests get its value instead of running it ([tool.devpool.once]).

The process of its own is a worker started with ONCE_ENV naming its fixture (run/once.py).
It sets the fixture up as the setup of the first collected test that uses it would, writes
what the tests get to the run's once folder (ONCE_DIR_ENV), says so (protocol.OnceUp),
waits for the controller's stop, then tears the fixture down and says so (OnceDown).

In a worker, a test's setup finds the file of each once-fixture it uses: the fixture's
definition no longer asks for the fixtures it uses (those run in its own process only), the
test's closure drops the ones only it needed, and pytest_fixture_setup answers with the
value, cached as pytest caches one. A setup that raised gives each test the report plain
pytest would show; a skip, the same skip. No file (not a once-fixture on this run's
platform, or not started): the fixture runs here as an ordinary one.

On Ray the workers' nodes do not share the controller's folder: the process of its own
ships its outcome in its OnceUp (SHIP_ENV), and the controller sends it with each batch
whose tests use it, once per worker (protocol.Run.once, OnceValues.given).
"""

from __future__ import annotations

import base64
import contextlib
import gc
import inspect
import json
import os
import pickle
import time
from collections.abc import Collection, Generator, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from devpool.compat.fixtures import fixture_definitions
from devpool.plan.once import declared
from devpool.worker import protocol, wire

ONCE_ENV = "DEVPOOL_ONCE_SETUP"  # in a once-fixture's own process: the fixture's name
ONCE_DIR_ENV = "DEVPOOL_ONCE_DIR"  # in every process of a run with once-fixtures
# In a once-fixture's own process on Ray: its outcome travels in its OnceUp, not a file (the
# controller hands it to each worker that runs a user, on whichever node, in its Run).
SHIP_ENV = "DEVPOOL_ONCE_SHIP"


def result_path(folder: Path, name: str) -> Path:
    """Where a once-fixture's outcome lies: ("value", pickled value), ("error", report) or
    ("skip", message), pickled."""
    return folder / f"{name}.pickle"


def deps_path(folder: Path, name: str) -> Path:
    """Where a once-fixture's dependencies lie in a recording run (--devpool-select record):
    what its process ran and read, as select/record.py's Recorder.once_deps says it."""
    return folder / f"{name}.deps.json"


def write_result(folder: Path, name: str, kind: str, payload: Any) -> None:
    """Write a once-fixture's outcome whole (a reader never sees half of it)."""
    _write_whole(result_path(folder, name), pickle.dumps((kind, payload)))


def shipped(kind: str, payload: Any) -> str:
    """A once-fixture's outcome as it travels (OnceUp.result, Run.once): its file's bytes."""
    return base64.b64encode(pickle.dumps((kind, payload))).decode("ascii")


def _write_whole(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.part")
    partial.write_bytes(data)
    os.replace(partial, target)


def unpicklable(name: str, value: object, exc: BaseException) -> str:
    """The sentence a test gets when its once-fixture's value cannot travel."""
    kind = type(value)
    return (
        f"[tool.devpool.once] {name}'s value, of type {kind.__module__}.{kind.__qualname__}, "
        f"cannot be pickled to reach the tests in other processes ({exc}); return what can "
        "(an address, a path, a dataclass of them)"
    )


class OnceFailed(Exception):
    """Raised in a worker for a test whose once-fixture's setup failed: its report shows
    what the fixture's own process saw (longrepr: a report's, or one sentence)."""

    def __init__(self, name: str, longrepr: Any) -> None:
        super().__init__(f"once-fixture {name} failed in its own process")
        self.longrepr = longrepr


def closure_without(
    closure: Sequence[str],
    initial: Iterable[str],
    definitions: Mapping[str, Sequence[Any]],
    once: Collection[str],
) -> list[str]:
    """A test's fixture closure less what only its once-fixtures asked for."""
    keep: set[str] = set()
    todo = list(initial)
    while todo:
        name = todo.pop()
        if name in keep:
            continue
        keep.add(name)
        if name in once:
            continue
        for definition in definitions.get(name, ()):
            todo.extend(definition.argnames)
    return [name for name in closure if name in keep]


class OnceValues:
    """A worker's plugin: the tests' once-fixtures answered from their files. The folder is
    read when a test starts (a worker forked from a template gets it then); without one, a
    run with no once-fixture, every fixture is an ordinary one."""

    def __init__(self, config: pytest.Config, names: Collection[str]) -> None:
        self.config = config
        self.folder = Path()
        self.names = frozenset(names)  # the table's; the marked ones are found by their mark
        self.results: dict[str, tuple[str, Any]] = {}
        self.answers: dict[int, str] = {}  # id(fixturedef) → its fixture's name
        self.deps: dict[str, dict[str, Any]] = {}  # fixture → what its process recorded

    def recorded(self, item: pytest.Item) -> list[tuple[str, dict[str, Any]]]:
        """In a recording run: what the process of each once-fixture this test got ran and
        read, a part of the test's dependencies (select/record.py)."""
        info: Any = getattr(item, "_fixtureinfo", None)
        found = []
        for name in sorted(set(self.answers.values()) & set(_fixturenames(item))):
            definitions = info.name2fixturedefs.get(name) if info is not None else None
            if not definitions or self.answers.get(id(definitions[-1])) != name:
                continue  # an ordinary fixture here: its code is the test's own
            if name not in self.deps:
                try:
                    self.deps[name] = json.loads(deps_path(self.folder, name).read_bytes())
                except (OSError, ValueError) as exc:
                    why = f"its dependencies could not be read: {exc}"
                    self.deps[name] = {"recorded": False, "why": why}
            found.append((name, self.deps[name]))
        return found

    def given(self, values: Mapping[str, str]) -> None:
        """On Ray: the outcomes of this batch's once-fixtures, shipped with it (Run.once)."""
        for name, data in values.items():
            self.results[name] = self._decoded(name, base64.b64decode(data))

    def _result(self, name: str) -> tuple[str, Any] | None:
        if name in self.results or not self.folder.parts:  # no folder: what was shipped
            return self.results.get(name)
        try:
            data = result_path(self.folder, name).read_bytes()
        except FileNotFoundError:
            return None
        self.results[name] = self._decoded(name, data)
        return self.results[name]

    def _decoded(self, name: str, data: bytes) -> tuple[str, Any]:
        kind, payload = pickle.loads(data)
        if kind == "value":
            try:
                payload = pickle.loads(payload)
            except Exception as exc:  # noqa: BLE001 - said to the tests that use it
                kind = "error"
                payload = f"[tool.devpool.once] {name}'s value cannot be unpickled here: {exc!r}"
        elif kind == "error" and isinstance(payload, dict):
            hook = self.config.hook
            payload = hook.pytest_report_from_serializable(config=self.config, data=payload)
            payload = payload.longrepr
        return kind, payload

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        folder = os.environ.get(ONCE_DIR_ENV)
        info: Any = getattr(item, "_fixtureinfo", None)
        if not (folder or self.results) or info is None:
            return  # no once-fixture in this run
        self.folder = Path(folder or self.folder)
        definitions_of = info.name2fixturedefs
        used = [
            name
            for name in _fixturenames(item)
            if name in self.names
            or (name in definitions_of and declared(definitions_of[name][-1].func) is not None)
        ]
        if not used:
            return
        answered = set()
        for name in used:
            definitions = info.name2fixturedefs.get(name)
            if not definitions or definitions[-1].scope != "session":
                continue
            if self._result(name) is None:
                continue  # not run once here: an ordinary fixture
            fixturedef = definitions[-1]
            if id(fixturedef) not in self.answers:
                self.answers[id(fixturedef)] = name
                fixturedef.argnames = ()  # what it uses is set up in its own process only
            answered.add(name)
        if answered:
            item.fixturenames = closure_without(  # type: ignore[attr-defined]
                item.fixturenames,  # type: ignore[attr-defined]
                info.initialnames,
                info.name2fixturedefs,
                answered,
            )

    @pytest.hookimpl(tryfirst=True)
    def pytest_fixture_setup(self, fixturedef: Any, request: Any) -> Any:
        name = self.answers.get(id(fixturedef))
        if name is None:
            return None
        result = self._result(name)
        assert result is not None
        kind, payload = result
        key = fixturedef.cache_key(request)
        if kind == "value":
            fixturedef.cached_result = (payload, key, None)
            return payload
        try:
            if kind == "skip":
                raise pytest.skip.Exception(payload, _use_item_location=True)
            raise OnceFailed(name, payload)
        except BaseException as exc:
            fixturedef.cached_result = (None, key, (exc, exc.__traceback__))
            raise

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        excinfo = call.excinfo
        if excinfo is not None and isinstance(excinfo.value, OnceFailed):
            report.longrepr = excinfo.value.longrepr
        return report


class OnceProcessPlugin:
    """The plugin of a once-fixture's own process: instead of running tests, set the
    fixture up, say so, wait for the stop, tear it down, say so."""

    def __init__(self, config: pytest.Config, name: str, folder: Path) -> None:
        self.config = config
        self.name = name
        self.folder = folder

    @classmethod
    def forked(cls, config: pytest.Config) -> OnceProcessPlugin:
        """In a child a template forked to set a once-fixture up (its environment names it).
        What the template collected stays frozen: the collector never walks those pages."""
        gc.freeze()
        return cls(config, os.environ[ONCE_ENV], Path(os.environ[ONCE_DIR_ENV]))

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        worker: Any = self.config.pluginmanager.get_plugin("devpool-worker")
        worker.leaks.start_worker()  # what the fixture starts is found at its teardown
        worker.send(protocol.Ready(pid=os.getpid(), collected=len(session.items)))
        item = next((i for i in session.items if self.name in _fixturenames(i)), None)
        setup_state: Any = session._setupstate  # noqa: SLF001 - pytest's own, as a test's setup
        started = time.monotonic()
        recorder: Any = self.config.pluginmanager.get_plugin("devpool-select-recorder")
        if recorder is not None:  # a recording run: its users depend on what it runs
            recorder.once_begin()
        if item is None:
            text = f"no test that uses {self.name} was collected in its process"
            kind, payload = "error", f"[tool.devpool.once] {text}"
        else:
            setup_state.setup(session)  # the session's finalizers: the fixture's teardown
            request: Any = getattr(item, "_request")  # noqa: B009 - pytest's own
            call = pytest.CallInfo.from_call(
                lambda: request.getfixturevalue(self.name),
                when="setup",
                reraise=(KeyboardInterrupt,),
            )
            kind, payload, text = self._outcome(item, _from_fixtures(call, session))
        ship = shipped(kind, payload) if os.environ.get(SHIP_ENV) else None
        if recorder is not None and ship is None:  # before the result: a user finds both
            deps = json.dumps(recorder.once_deps()).encode()
            _write_whole(deps_path(self.folder, self.name), deps)
        if ship is None:
            write_result(self.folder, self.name, kind, payload)
        seconds = round(time.monotonic() - started, 3)
        worker.send(protocol.OnceUp(self.name, kind, seconds, text, result=ship))
        commands = wire.Commands(worker.fd_in)
        while (message := commands.next()) is not None and not isinstance(message, protocol.Stop):
            pass  # nothing but the stop is for it
        started = time.monotonic()
        call = pytest.CallInfo.from_call(
            lambda: setup_state.teardown_exact(None), when="teardown", reraise=(KeyboardInterrupt,)
        )
        error = None
        if call.excinfo is not None and item is not None:
            call = _from_fixtures(call, session)
            report = pytest.TestReport.from_item_and_call(item, call)
            error = self.config.hook.pytest_report_to_serializable(
                config=self.config, report=report
            )
        left = worker.leaks.at_exit()
        seconds = round(time.monotonic() - started, 3)
        with contextlib.suppress(OSError):  # the controller is gone: nobody to tell
            worker.send(*left, protocol.OnceDown(fixture=self.name, seconds=seconds, error=error))
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:  # the controller writes the summary
            self.config.pluginmanager.unregister(reporter)
        return True

    def _outcome(self, item: pytest.Item, call: pytest.CallInfo[Any]) -> tuple[str, Any, str]:
        """(kind, payload, one line) of the setup: the value pickled, a skip's message, or
        the report plain pytest would make of the error."""
        excinfo = call.excinfo
        if excinfo is None:
            value = call.result
            try:
                return "value", pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL), ""
            except Exception as exc:  # noqa: BLE001 - any pickling error is the user's to fix
                sentence = unpicklable(self.name, value, exc)
                return "error", sentence, sentence
        if isinstance(excinfo.value, pytest.skip.Exception):
            message = str(excinfo.value.msg)
            return "skip", message, message
        report = pytest.TestReport.from_item_and_call(item, call)
        data = self.config.hook.pytest_report_to_serializable(config=self.config, report=report)
        return "error", data, excinfo.exconly().strip().splitlines()[-1]


def _from_fixtures(call: pytest.CallInfo[Any], session: pytest.Session) -> pytest.CallInfo[Any]:
    """The call's traceback from the first fixture function on: what plain pytest shows of
    a fixture's error (the frames above it, devpool's own here, are not the test's)."""
    if call.excinfo is None:
        return call
    codes = set()
    for definitions in fixture_definitions(session).values():
        for definition in definitions:
            func = inspect.unwrap(getattr(definition.func, "__func__", definition.func))
            codes.add(getattr(func, "__code__", None))
    tb: TracebackType | None = call.excinfo.tb
    while tb is not None and tb.tb_frame.f_code not in codes:
        tb = tb.tb_next
    if tb is not None:
        excinfo = call.excinfo
        call.excinfo = pytest.ExceptionInfo.from_exc_info((excinfo.type, excinfo.value, tb))
    return call


def _fixturenames(item: pytest.Item) -> Sequence[str]:
    return getattr(item, "fixturenames", ())


def take_shipped(config: pytest.Config, batch: protocol.Run | protocol.More) -> None:
    """On Ray: the outcomes of a batch's once-fixtures, before its tests (OnceValues.given)."""
    if batch.once:
        values: Any = config.pluginmanager.get_plugin("devpool-once")
        values.given(batch.once)


def register_worker(config: pytest.Config, names: Collection[str]) -> None:
    """In every worker: answer for the run's once-fixtures (none: nothing), or, in a
    once-fixture's own process, run one. names: the table's."""
    folder, own = os.environ.get(ONCE_DIR_ENV), os.environ.get(ONCE_ENV)
    if own and (folder or os.environ.get(SHIP_ENV)):  # on Ray: no folder, its outcome ships
        config.pluginmanager.register(
            OnceProcessPlugin(config, own, Path(folder or ".")), "devpool-once"
        )
    else:
        config.pluginmanager.register(OnceValues(config, names), "devpool-once")
