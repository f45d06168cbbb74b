"""plan/once.py: [tool.devpool.once] read into requests, and every mistake in it one sentence
naming the fixture and what is wrong."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from devpool.config import settings_from
from devpool.errors import DevpoolError
from devpool.plan.once import OnceFixture, fixture_error, parse_once, unsatisfiable

PLATFORMS = ("cuda", "sim")


def once(table: dict[str, Any]) -> dict[str, OnceFixture]:
    parsed = parse_once({"once": table}, "p.toml", PLATFORMS, {"hccl": 2})
    return {fixture.name: fixture for fixture in parsed}


def test_each_fixture_gets_the_request_its_table_writes() -> None:
    got = once(
        {
            "model_server": {"device_count": 1, "ports": 2, "timeout": 30, "cpus": 2},
            "dataset": {},
            "shared": {"device_memory": "2GiB", "resources": {"hccl": 1}, "platforms": ["sim"]},
        }
    )
    server = got["model_server"].request
    assert (server.device_count, server.ports, server.timeout, server.cpus) == (1, 2, 30, 2)
    assert got["dataset"].request.device_count == 0 and got["dataset"].written == "{}"
    shared = got["shared"].request
    assert shared.device_memory == 2 << 30 and shared.device_count == 1  # a share of one
    assert shared.resources == (("hccl", 1),) and shared.platforms == ("sim",)
    assert got["shared"].runs_on("sim", "sim") and not got["shared"].runs_on("cuda", "cuda")
    assert got["dataset"].runs_on("cuda", "cuda")


@pytest.mark.parametrize(
    ("table", "said"),
    [
        ({"server": {"ranks": 2}}, "p.toml: [tool.devpool.once] server has request key 'ranks'"),
        ({"server": {"device_cont": 1}}, "did you mean device_count?"),
        ({"server": 1}, "[tool.devpool.once] server must be a table of request keys"),
        ({"server": {"device_count": -1}}, "server device_count must be a whole number ≥ 0"),
        ({"server": {"platforms": ["tpu"]}}, "names unknown platform 'tpu'"),
        ({"server": {"resources": {"nccl": 1}}}, "names unknown resource 'nccl'"),
        ({"not a name": {}}, "'not a name' is not a fixture name"),
    ],
)
def test_a_mistake_is_one_sentence_naming_the_fixture(table: dict[str, Any], said: str) -> None:
    with pytest.raises(DevpoolError) as raised:
        once(table)
    assert said in str(raised.value)
    assert "\n" not in str(raised.value)


def test_the_table_is_a_key_of_tool_devpool_and_not_of_a_profile() -> None:
    settings_from({}, {"once": {"server": {}}}, "p.toml")  # a key it knows
    with pytest.raises(DevpoolError, match=r"\[tool.devpool.profiles.ci\] has unknown key 'once'"):
        settings_from({}, {"profiles": {"ci": {"once": {}}}}, "p.toml")
    with pytest.raises(DevpoolError, match="once"):
        parse_once({"once": ["server"]}, "p.toml", PLATFORMS)


def fixture(scope: str = "session", params: object = None) -> SimpleNamespace:
    return SimpleNamespace(scope=scope, params=params)


def test_only_a_session_fixture_with_one_value_can_run_once() -> None:
    assert fixture_error("server", [fixture()], ["server"]) == ""
    assert "is not a session-scoped fixture of the collected suite; did you mean server?" in (
        fixture_error("servr", None, ["server"])
    )
    assert "'server' is a function-scoped fixture" in fixture_error(
        "server", [fixture("function")], []
    )
    assert "is parametrized" in fixture_error("server", [fixture(params=[1, 2])], [])


def test_a_request_the_run_cannot_hold_is_named() -> None:
    server = once({"server": {"device_count": 3, "cpus": 4}})["server"]
    assert unsatisfiable(server, 2, 8, "sim") == (
        "[tool.devpool.once] server asks for 3 devices; this run has 2 (sim)"
    )
    assert "asks for 4 CPU slots; this run has 2" in unsatisfiable(server, 4, 2, "sim")
    assert unsatisfiable(server, 4, 8, "sim") == ""
