"""[tool.devpool.once]: session fixtures that run once per run, each with a lease of its own.

    [tool.devpool.once]
    model_server = { device_count = 1, ports = 1 }
    dataset = {}

Each key names a session-scoped fixture; its value is a request as [tool.devpool.paths]
takes one (device_count, device_memory, ports, cpus, resources, platforms, timeout). The
table is read and checked here, once at configuration (keys and values) and once after
collection (each name is a session fixture of the collected suite; a host can hold its
request). Where it runs and how its value reaches the tests: run/once.py (the
controller's side) and worker/once.py (the processes' side).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest

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


def history_id(name: str) -> str:
    """A once-fixture's name in the duration history: the seconds its lease was held, from
    its start to its teardown (capacity counts them; no test has this id)."""
    return f"[once] {name}"


@dataclass(frozen=True)
class OnceFixture:
    """One fixture of [tool.devpool.once]: its name and what its process asks for."""

    name: str
    request: Request
    written: str = "{}"  # its request as the table wrote it, for the lines that name it

    def runs_on(self, platform: str, kind: str) -> bool:
        """Whether it is a once-fixture on this platform (elsewhere: an ordinary fixture)."""
        listed = self.request.platforms
        return listed is None or platform in listed or kind in listed


def parse_once(
    table: Mapping[str, Any],
    where: str,
    platforms: Collection[str],
    resources: Mapping[str, int] | None = None,
) -> tuple[OnceFixture, ...]:
    """[tool.devpool] once → its fixtures; DevpoolError names the fixture and key at fault."""
    raw = table.get("once", {})
    if not isinstance(raw, dict):
        raise DevpoolError(
            f"{where}: [tool.devpool.once] must be a table of fixture name = request table"
        )
    fixtures = []
    for name, value in raw.items():
        place = f"{where}: [tool.devpool.once] {name}"
        if not str(name).isidentifier():
            raise DevpoolError(f"{where}: [tool.devpool.once] {name!r} is not a fixture name")
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
        fixtures.append(OnceFixture(str(name), request, written if value else "{}"))
    return tuple(fixtures)


def fixture_error(name: str, definitions: Sequence[Any] | None, known: Collection[str]) -> str:
    """Why a name cannot be a once-fixture of this suite ("" when it can): not a fixture,
    not session-scoped, or parametrized."""
    if not definitions:
        hint = did_you_mean(name, known)
        return (
            f"[tool.devpool.once] {name!r} is not a session-scoped fixture of the collected "
            f"suite{hint}"
        )
    scopes = sorted({str(d.scope) for d in definitions if d.scope != "session"})
    if scopes:
        return (
            f"[tool.devpool.once] {name!r} is a {scopes[0]}-scoped fixture; only a "
            "session-scoped fixture runs once per run"
        )
    if any(d.params is not None for d in definitions):
        return (
            f"[tool.devpool.once] {name!r} is parametrized; a once-fixture has one value for "
            "the whole run"
        )
    return ""


def unsatisfiable(fixture: OnceFixture, devices: int, cpu_slots: int, platform: str) -> str:
    """Why this host can never hold the fixture's request ("" when it can)."""
    request = fixture.request
    if request.device_count > devices:
        return (
            f"[tool.devpool.once] {fixture.name} asks for {request.device_count} devices; this "
            f"run has {devices} ({platform})"
        )
    if request.cpus > cpu_slots:
        return (
            f"[tool.devpool.once] {fixture.name} asks for {request.cpus} CPU slots; this run "
            f"has {cpu_slots}"
        )
    return ""


class OnceCheck:
    """The controller's plugin: after collection, every once-fixture is checked against the
    suite and the host; the loop reads the checked ones here (run/once.py)."""

    def __init__(
        self,
        fixtures: Sequence[OnceFixture],
        where: str,
        devices: int,
        cpu_slots: int,
        platform: tuple[str, str],
        skip_unsatisfiable: bool,
    ) -> None:
        self.where = where
        self.platform = platform  # (name, kind)
        self.devices = devices
        self.cpu_slots = cpu_slots
        self.skip_unsatisfiable = skip_unsatisfiable
        # Only those that run once on this platform; the others stay ordinary fixtures.
        self.fixtures = tuple(f for f in fixtures if f.runs_on(*platform))
        self.skipped: dict[str, str] = {}  # fixture → why its tests are skipped

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        config = session.config
        narrowed = config.args_source == pytest.Config.ArgsSource.ARGS
        manager: Any = session._fixturemanager  # noqa: SLF001 - pytest has no public lookup
        known = manager._arg2fixturedefs  # noqa: SLF001
        sessions = [n for n, defs in known.items() if any(d.scope == "session" for d in defs)]
        for fixture in self.fixtures:
            definitions = known.get(fixture.name)
            if not definitions and narrowed:
                continue  # a part of the suite that does not collect where it is defined
            wrong = fixture_error(fixture.name, definitions, sessions)
            if wrong:
                raise pytest.UsageError(f"{self.where}: {wrong}")
            reason = unsatisfiable(fixture, self.devices, self.cpu_slots, self.platform[0])
            if reason and not self.skip_unsatisfiable:
                raise pytest.UsageError(
                    f"{self.where}: {reason}; lower it, or pass --devpool-skip-unsatisfiable "
                    "to skip the tests that use it"
                )
            if reason:
                self.skipped[fixture.name] = reason
