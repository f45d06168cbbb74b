"""run/once.py driven by scripted workers (tests/run/fake_backend.py): a once-fixture's
process is up before its first user starts, holds its device alone, and is stopped after
its last user ended; a once-process that dies ends its users infra."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    users=st.integers(0, 5),
    others=st.integers(0, 5),
    devices=st.integers(0, 2),
    fate=st.sampled_from(["server", "lost_server", "dies_server"]),
)
def test_every_job_ends_once_and_the_once_fixture_holds_its_devices_alone(
    tmp_path_factory: pytest.TempPathFactory, users: int, others: int, devices: int, fate: str
) -> None:
    """Over random suites and once-process fates: every job has one final outcome, the run
    ends, no test starts on the fixture's devices while it is up, none of its users before
    it is up, and its process ends before the run does."""
    root = tmp_path_factory.mktemp("suite")
    (root / "fake_backend.py").write_text(FAKE.read_text(encoding="utf-8"))
    (root / "pyproject.toml").write_text(
        f"[tool.devpool.once]\n{fate} = {{ device_count = {devices} }}\n"
    )
    (root / "conftest.py").write_text(
        f"import pytest\n\n@pytest.fixture(scope='session')\ndef {fate}():\n    return 1\n"
    )
    tests = "import pytest\n"
    if users:
        tests += f"@pytest.mark.parametrize('i', range({users}))\n"
        tests += f"def test_pass_user({fate}, i): pass\n"
    if others:
        tests += f"@pytest.mark.parametrize('i', range({others}))\n"
        tests += "def test_pass_other(i): pass\n"
    (root / "test_s.py").write_text(tests)
    (root / "locks").mkdir()
    record = root / "record.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "devpool.plugin", "-p", "no:cacheprovider",
         "-p", "no:randomly", "-p", "fake_backend", f"--devpool-lock-dir={root / 'locks'}",
         f"--devpool-run-record={record}", "--devices", "sim:0-2", "-q"],
        cwd=root, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode in (0, 1, 5), done.stdout + done.stderr
    lines = [json.loads(line) for line in record.read_text().splitlines() if line.strip()]
    ends = [line for line in lines if line["type"] == "job_end" and not line.get("retried")]
    assert sorted(line["test"] for line in ends) == sorted(
        [f"test_s.py::test_pass_user[{i}]" for i in range(users)]
        + [f"test_s.py::test_pass_other[{i}]" for i in range(others)]
    )  # one final outcome each
    kinds = [line["type"] for line in lines]
    assert kinds[-1] == "session_end"
    if not users:
        assert "once_start" not in kinds  # nobody uses it: never started
        return
    [start] = [line for line in lines if line["type"] == "once_start"]
    up = kinds.index("once_setup") if "once_setup" in kinds else len(lines)
    gone = kinds.index("once_teardown") if "once_teardown" in kinds else kinds.index("once_lost")
    for i, line in enumerate(lines):
        if line["type"] == "job_start" and kinds.index("once_start") < i < gone:
            assert not set(line["devices"]) & set(start["devices"]), line
        if line["type"] == "job_start" and "user" in line["nodeid"]:
            assert i > up and fate == "server", line  # users run only against a live fixture
    outcomes = {line["outcome"] for line in ends if "user" in line["test"]}
    assert outcomes == ({"passed"} if fate == "server" else {"infra"})
