"""[tool.devpool.once]: session fixtures that run once per run, each with a lease of its own.

    [tool.devpool.once]
    model_server = { device_count = 1, ports = 1 }
    dataset = {}

Each key names a session-scoped fixture; its value is a request as [tool.devpool.paths]
takes one (device_count, device_memory, ports, cpus, resources, platforms, timeout). The
same in code: `@devpool.once(device_count=1, ports=1)` above `@pytest.fixture(...)` (it
marks the fixture's function, declare(); a no-op under plain pytest). The table is read and
checked here, once at configuration (keys and values) and once after collection (each name
is a session fixture of the collected suite; a host can hold its request), when the marked
fixtures are found and checked alike. Where it runs and how its value reaches the tests:
run/once.py (the controller's side) and worker/once.py (the processes' side).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import pytest

from devpool.compat.fixtures import fixture_definitions
from devpool.devices.sizes import parse_size
from devpool.errors import DevpoolError, did_you_mean
from devpool.plan.markers import Request
from devpool.plan.rules import request_values

ONCE_KEYS = (
    "device_count",
    "device_memory",
    "ports",
    "cpus",
    "resources",
    "platforms",
    "timeout",
)
PLUGIN = "devpool-once"  # the name OnceCheck is registered under (the loop finds it there)
TABLE = "[tool.devpool.once]"
CODE = "@devpool.once on"
DECLARED_ATTR = "_devpool_once"  # on a marked fixture's function: its request, as written
DECLARED: list[Callable[..., Any]] = []  # the functions marked in this process
Fixture = TypeVar("Fixture")


def declare(request: Mapping[str, Any]) -> Callable[[Fixture], Fixture]:
    """@devpool.once(...): mark the fixture's function (above @pytest.fixture, or below
    it) with its request; nothing else changes, so plain pytest sees an ordinary fixture."""

    def mark(fixture: Fixture) -> Fixture:
        wrapped = getattr(fixture, "_get_wrapped_function", None)  # pytest's fixture object
        function = wrapped() if callable(wrapped) else fixture
        setattr(function, DECLARED_ATTR, dict(request))
        DECLARED.append(function)  # type: ignore[arg-type]
        return fixture

    return mark


def declared(function: Any) -> dict[str, Any] | None:
    """The request @devpool.once gave a fixture's function (None: not marked)."""
    found = getattr(getattr(function, "__func__", function), DECLARED_ATTR, None)
    return found if isinstance(found, dict) else None


def _current(function: Any) -> bool:
    """Whether a marked function is what its module, as imported now, defines (not one of an
    earlier session in this process, nor a function defined inside another)."""
    found: Any = sys.modules.get(getattr(function, "__module__", ""))
    for part in getattr(function, "__qualname__", "<locals>").split("."):
        found = getattr(found, part, None)
    wrapped = getattr(found, "_get_wrapped_function", None)
    return (wrapped() if callable(wrapped) else found) is function


def code_place(function: Any, root: Path) -> str:
    """`tests/conftest.py:12`: where a marked function is defined."""
    function = inspect.unwrap(getattr(function, "__func__", function))
    code = getattr(function, "__code__", None)
    if code is None:
        return getattr(function, "__qualname__", repr(function))
    path = Path(code.co_filename)
    if path.is_relative_to(root):
        path = path.relative_to(root)
    return f"{path}:{code.co_firstlineno}"


def history_id(name: str) -> str:
    """A once-fixture's name in the duration history: the seconds its lease was held, from
    its start to its teardown (capacity counts them; no test has this id)."""
    return f"[once] {name}"


def setup_history_id(name: str) -> str:
    """A once-fixture's setup in the duration history: the seconds its setup took (a shard
    with a user of it pays that much; no test has this id)."""
    return f"[once setup] {name}"


def setup_estimate(name: str, estimates: Mapping[str, float], default: float) -> float:
    """The seconds a once-fixture's setup takes: the history's, else the default estimate
    (as for a test never run)."""
    return estimates.get(setup_history_id(name), default)


@dataclass(frozen=True)
class OnceFixture:
    """One fixture of [tool.devpool.once]: its name and what its process asks for."""

    name: str
    request: Request
    written: str = "{}"  # its request as the table wrote it, for the lines that name it
    source: str = TABLE  # how the sentences that name it begin: TABLE, or CODE

    def runs_on(self, platform: str, kind: str) -> bool:
        """Whether it is a once-fixture on this platform (elsewhere: an ordinary fixture)."""
        listed = self.request.platforms
        return listed is None or platform in listed or kind in listed


def parse_once(
    table: Mapping[str, Any],
    where: str,
    platforms: Collection[str],
    resources: Mapping[str, int] | None = None,
    source: str = TABLE,
) -> tuple[OnceFixture, ...]:
    """[tool.devpool] once → its fixtures; DevpoolError names the fixture and key at fault.
    source=CODE: the requests of @devpool.once, where: the marked function's place."""
    raw = table.get("once", {})
    if not isinstance(raw, dict):
        raise DevpoolError(
            f"{where}: [tool.devpool.once] must be a table of fixture name = request table"
        )
    fixtures = []
    for name, value in raw.items():
        place = f"{where}: {source} {name}"
        if not str(name).isidentifier():
            raise DevpoolError(f"{where}: {source} {name!r} is not a fixture name")
        if not isinstance(value, dict):
            raise DevpoolError(
                f"{place} must be a table of request keys, e.g. {{ device_count = 1, ports = 1 }}"
                f" or {{}}, got {value!r}"
            )
        for key in value:
            if key not in ONCE_KEYS:
                hint = did_you_mean(str(key), ONCE_KEYS) or f"; it takes {', '.join(ONCE_KEYS)}"
                raise DevpoolError(f"{place} has request key {key!r}, which it cannot take{hint}")
        values = request_values(value, place, platforms, resources or {}) if value else {}
        memory = values.get("device_memory")
        request = Request(
            device_count=values.get("device_count", 0),
            device_memory=parse_size(memory) if memory is not None else None,
            ports=values.get("ports", 0),
            cpus=values.get("cpus", 0),
            resources=values.get("resources", ()),
            platforms=values.get("platforms"),
            timeout=values.get("timeout") or None,
        )
        if request.device_memory is not None and not request.device_count:
            request = replace(request, device_count=1)  # a share of one device
        written = "{ " + ", ".join(f"{k} = {v!r}" for k, v in value.items()) + " }"
        fixtures.append(OnceFixture(str(name), request, written if value else "{}", source))
    return tuple(fixtures)


def marked_on(
    item: pytest.Item,
    known: Collection[str],
    root: Path,
    platforms: Collection[str],
    resources: Mapping[str, int],
) -> tuple[OnceFixture, ...]:
    """The fixtures @devpool.once marked that a collected test uses, those `known` names
    left out, their requests parsed; DevpoolError names the fixture at fault."""
    info: Any = getattr(item, "_fixtureinfo", None)
    found: tuple[OnceFixture, ...] = ()
    for name, definitions in getattr(info, "name2fixturedefs", {}).items():
        request = declared(definitions[-1].func) if definitions else None
        if request is None or name in known:
            continue
        place = code_place(definitions[-1].func, root)
        found += parse_once({"once": {name: request}}, place, platforms, resources, CODE)
    return found


def fixture_error(
    name: str, definitions: Sequence[Any] | None, known: Collection[str], source: str = TABLE
) -> str:
    """Why a name cannot be a once-fixture of this suite ("" when it can): not a fixture,
    not session-scoped, or parametrized."""
    if not definitions:
        hint = did_you_mean(name, known)
        return f"{source} {name!r} is not a session-scoped fixture of the collected suite{hint}"
    scopes = sorted({str(d.scope) for d in definitions if d.scope != "session"})
    if scopes:
        return (
            f"{source} {name!r} is a {scopes[0]}-scoped fixture; only a session-scoped fixture "
            "runs once per run"
        )
    if any(d.params is not None for d in definitions):
        return f"{source} {name!r} is parametrized; a once-fixture has one value for the whole run"
    return ""


def unsatisfiable(fixture: OnceFixture, devices: int, cpu_slots: int, platform: str) -> str:
    """Why this host can never hold the fixture's request ("" when it can)."""
    request = fixture.request
    if request.device_count > devices:
        return (
            f"{fixture.source} {fixture.name} asks for {request.device_count} devices; this "
            f"run has {devices} ({platform})"
        )
    if request.cpus > cpu_slots:
        return (
            f"{fixture.source} {fixture.name} asks for {request.cpus} CPU slots; this run "
            f"has {cpu_slots}"
        )
    return ""


class OnceCheck:
    """The controller's plugin: after collection, every once-fixture (the table's, and the
    fixtures @devpool.once marked) is checked against the suite and the host; the loop reads
    the checked ones here (run/once.py)."""

    def __init__(
        self,
        fixtures: Sequence[OnceFixture],
        where: str,
        devices: int,
        cpu_slots: int,
        platform: tuple[str, str],
        skip_unsatisfiable: bool,
        parse: tuple[Collection[str], Mapping[str, int]] = ((), {}),
    ) -> None:
        self.where = where
        self.platform = platform  # (name, kind)
        self.devices = devices
        self.cpu_slots = cpu_slots
        self.skip_unsatisfiable = skip_unsatisfiable
        self.parse = parse  # the platforms and resources a marked fixture's request may name
        self.table = tuple(fixtures)
        # Only those that run once on this platform; the others stay ordinary fixtures.
        self.fixtures = tuple(f for f in fixtures if f.runs_on(*platform))
        self.skipped: dict[str, str] = {}  # fixture → why its tests are skipped

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        config = session.config
        narrowed = config.args_source == pytest.Config.ArgsSource.ARGS
        known = fixture_definitions(session)
        sessions = [n for n, defs in known.items() if any(d.scope == "session" for d in defs)]
        places = {fixture.name: self.where for fixture in self.fixtures}
        marked = self._marked(known, config.rootpath, places)
        self.fixtures += tuple(f for f in marked if f.runs_on(*self.platform))
        for fixture in self.fixtures:
            definitions = known.get(fixture.name)
            if not definitions and narrowed:
                continue  # a part of the suite that does not collect where it is defined
            wrong = fixture_error(fixture.name, definitions, sessions, fixture.source)
            if wrong:
                raise pytest.UsageError(f"{places[fixture.name]}: {wrong}")
            reason = unsatisfiable(fixture, self.devices, self.cpu_slots, self.platform[0])
            if reason and not self.skip_unsatisfiable:
                raise pytest.UsageError(
                    f"{places[fixture.name]}: {reason}; lower it, or pass "
                    "--devpool-skip-unsatisfiable to skip the tests that use it"
                )
            if reason:
                self.skipped[fixture.name] = reason

    def _marked(
        self, known: Mapping[str, Sequence[Any]], root: Path, places: dict[str, str]
    ) -> list[OnceFixture]:
        """The fixtures @devpool.once marked, their requests checked as the table's; a
        marked function that is no fixture is said as a name that is none."""
        found: list[OnceFixture] = []
        seen = set()
        named = {fixture.name for fixture in self.table}
        for name, definitions in known.items():
            for definition in definitions:
                request = declared(definition.func)
                if request is None:
                    continue
                seen.add(getattr(definition.func, "__func__", definition.func))
                place = code_place(definition.func, root)
                if name in named:
                    raise pytest.UsageError(
                        f"{place}: {name} is named both by @devpool.once and in {self.where} "
                        f"{TABLE}; keep one"
                    )
                try:
                    [fixture] = parse_once({"once": {name: request}}, place, *self.parse, CODE)
                except DevpoolError as exc:
                    raise pytest.UsageError(str(exc)) from None
                if name not in places:
                    found.append(fixture)
                    places[name] = place
                elif fixture.request != next(f for f in found if f.name == name).request:
                    raise pytest.UsageError(
                        f"{place}: @devpool.once on {name} asks for another request than at "
                        f"{places[name]}; one fixture name runs once with one request"
                    )
        for function in DECLARED:
            if function not in seen and _current(function):
                name = getattr(function, "__name__", "?")
                place = code_place(function, root)
                raise pytest.UsageError(
                    f"{place}: {CODE} {name!r} is not a session-scoped fixture of the collected "
                    'suite; put it above or below @pytest.fixture(scope="session")'
                )
        return found
