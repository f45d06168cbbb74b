"""run/once.py driven by scripted workers (tests/run/fake_backend.py): a once-fixture's
process is up before its first user starts, holds its device alone, and is stopped after
its last user ended; a once-process that dies ends its users infra."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

FAKE = Path(__file__).with_name("fake_backend.py")


@pytest.fixture(autouse=True)
def _quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)


def run(pytester: pytest.Pytester, fixture: str, tests: str) -> tuple[Any, list[dict[str, Any]]]:
    pytester.makepyfile(fake_backend=FAKE.read_text(encoding="utf-8"))
    pytester.makefile(
        ".toml", pyproject=f"[tool.devpool.once]\n{fixture} = {{ device_count = 1 }}\n"
    )
    pytester.makeconftest(
        f"import pytest\n\n@pytest.fixture(scope='session')\ndef {fixture}():\n    return 1\n"
    )
    pytester.makepyfile(test_s=tests)
    record = pytester.path / "record.jsonl"
    (pytester.path / "locks").mkdir()
    result = pytester.runpytest_subprocess(
        *("-p", "devpool.plugin", "-p", "no:cacheprovider", "-p", "no:randomly"),
        *("-p", "fake_backend", f"--devpool-lock-dir={pytester.path / 'locks'}"),
        f"--devpool-run-record={record}", "--devices", "sim:0-2", "-rA",
        timeout=60,
    )  # fmt: skip
    lines = [json.loads(line) for line in record.read_text().splitlines() if line.strip()]
    return result, lines


USERS = """
import pytest


@pytest.mark.device_count(1)
@pytest.mark.parametrize("i", range(6))
def test_pass_user(server, i):
    pass


@pytest.mark.device_count(1)
@pytest.mark.parametrize("i", range(6))
def test_pass_other(i):
    pass
"""


def test_users_start_after_its_setup_on_other_devices_and_it_stops_after_them(
    pytester: pytest.Pytester,
) -> None:
    result, lines = run(pytester, "server", USERS)
    assert result.ret == 0, result.stdout.str()
    kinds = [line["type"] for line in lines]
    up, down = kinds.index("once_setup"), kinds.index("once_teardown")
    [once] = [line for line in lines if line["type"] == "once_start"]
    starts = [(i, line) for i, line in enumerate(lines) if line["type"] == "job_start"]
    ends = [i for i, line in enumerate(lines) if line["type"] == "job_end"]
    users = [(i, line) for i, line in starts if "test_pass_user" in line["nodeid"]]
    assert len(users) == 6 and all(i > up for i, _ in users)  # after its setup
    assert not any(set(line["devices"]) & set(once["devices"]) for _, line in starts)
    last_user = max(
        i for i, line in enumerate(lines) if line["type"] == "job_end" and "user" in line["test"]
    )
    assert down > last_user and len(ends) == 12


def test_a_once_process_that_dies_ends_its_users_infra_and_the_others_run(
    pytester: pytest.Pytester,
) -> None:
    result, lines = run(pytester, "lost_server", USERS.replace("(server, i)", "(lost_server, i)"))
    outcomes = result.parseoutcomes()
    assert (outcomes.get("passed"), outcomes.get("infra")) == (6, 6), result.stdout.str()
    assert "once-fixture lost_server's process" in result.stdout.str()
    assert [line["type"] for line in lines].count("once_lost") == 1
