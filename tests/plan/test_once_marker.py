"""@devpool.once (plan/once.py declare): it marks the fixture's function with its request
and changes nothing else; what a worker and a recording read of a once-fixture."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import devpool
from devpool.plan.once import CODE, declared, parse_once
from devpool.select.record import with_libraries
from devpool.worker.once import OnceValues, deps_path


def test_the_marker_marks_the_function_above_or_below_the_fixture_and_nothing_else() -> None:
    def server() -> int:
        return 1

    fixture = pytest.fixture(scope="session")(server)
    assert devpool.once(device_count=1, ports=1)(fixture) is fixture  # above
    assert declared(server) == {"device_count": 1, "ports": 1}

    def dataset() -> int:
        return 2

    assert devpool.once(dataset) is dataset and declared(dataset) == {}  # bare, below
    [parsed] = parse_once({"once": {"server": declared(server)}}, "c.py:3", ["sim"], {}, CODE)
    assert (parsed.request.device_count, parsed.request.ports, parsed.source) == (1, 1, CODE)
    assert declared(lambda: None) is None


def _item(name: str, fixturedef: object) -> Any:
    info = SimpleNamespace(name2fixturedefs={name: [fixturedef]})
    return SimpleNamespace(fixturenames=[name], _fixtureinfo=info)


def test_a_test_gets_what_its_once_fixtures_process_recorded_or_is_unrecorded(
    tmp_path: Path,
) -> None:
    values = OnceValues(SimpleNamespace(), {"server"})  # type: ignore[arg-type]
    values.folder = tmp_path
    fixturedef = SimpleNamespace()
    item = _item("server", fixturedef)
    assert values.recorded(item) == []  # not answered here: an ordinary fixture
    values.answers[id(fixturedef)] = "server"
    [(name, deps)] = values.recorded(item)
    assert name == "server" and deps["recorded"] is False and "could not be read" in deps["why"]
    values.deps.clear()
    recorded = {"recorded": True, "spots": [["lib.py", 3]], "files": {}, "libs": {}}
    deps_path(tmp_path, "server").write_text(json.dumps(recorded))
    assert values.recorded(item) == [("server", recorded)]


def test_its_libraries_join_the_tests_table_only_when_new() -> None:
    libs = {"/lib/a.so": (1, 2)}
    merged: dict[Any, Any] = {}
    assert with_libraries(libs, {"/lib/a.so": [1, 2]}, merged) is libs  # the same table
    more = with_libraries(libs, {"/lib/b.so": [3, 4]}, merged)
    assert more == {"/lib/a.so": (1, 2), "/lib/b.so": (3, 4)}
    assert with_libraries(libs, {"/lib/b.so": [3, 4]}, merged) is more  # sent once
