"""Setup once per run (issue 57): a session fixture named in [tool.devpool.once] is set up
once, in a process of its own with a lease of its own, and torn down after its last user;
real sessions on sim devices.

The target's fixture records its setup and teardown, and its tests what they saw (their
devices, their process, the fixture's value), in OUT (sessions.PRELUDE's record()).
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from sessions import IN_ORDER, PORT_SERVER, events, records, suite

pytestmark = pytest.mark.usefixtures("_no_autoload")


# A server on the fixture's leased port, in a process the fixture starts: set up once, its
# address is the value every test gets.
CONFTEST = """
import json, os, socket, subprocess, sys, time
from pathlib import Path

import pytest

OUT = Path({out!r})


def note(key, **data):
    data.update(pid=os.getpid(), devices=os.environ.get("DEVPOOL_DEVICES"), at=time.time(),
                parent=os.getppid())
    with open(OUT / (key + ".jsonl"), "a") as handle:
        handle.write(json.dumps(data) + "\\n")

{server}

@pytest.fixture(scope="session")
def base():
    note("base")
    return "base"


@pytest.fixture(scope="session")
def server(base):
    port = int(os.environ["DEVPOOL_PORTS"].split(",")[0])
    proc = start_server(port)
    note("setup", port=port, server=proc.pid)
    yield dict(port=port, server=proc.pid, devices=os.environ["DEVPOOL_DEVICES"], base=base)
    proc.terminate()
    proc.wait()
    note("teardown")
"""

USERS = """
import socket


@pytest.mark.device_count(1)
@pytest.mark.parametrize("i", range({n}))
def test_uses(server, i):
    time.sleep(0.1)
    with socket.create_connection(("127.0.0.1", server["port"]), timeout=10) as conn:
        said = conn.recv(5)
    record(f"{{__name__}}-{{i}}", server=server, said=said.decode(), end=time.time(),
           parent=os.getppid())
"""


def _project(pytester: pytest.Pytester, out: Path, table: str, conftest: str) -> None:
    pytester.makefile(".toml", pyproject=f"[tool.devpool.once]\n{table}\n")
    pytester.makeconftest(conftest.format(out=str(out), server=PORT_SERVER))


def _lines(path: Path) -> list[dict[str, object]]:
    import json

    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _record(pytester: pytest.Pytester) -> Path:
    [record] = pytester.path.glob(".devpool/runs/*/record.jsonl")
    return record


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_server_fixture_is_set_up_once_on_a_device_and_port_of_its_own(
    pytester: pytest.Pytester, out: Path, lock: Path
) -> None:
    _project(pytester, out, "server = { device_count = 1, ports = 1 }", CONFTEST)
    suite(pytester, out, "test_one", USERS.format(n=6))
    suite(pytester, out, "test_two", USERS.format(n=6) + "\n\ndef test_beside():\n    pass\n")
    result = pytester.runpytest_subprocess(
        *IN_ORDER, f"--devpool-lock-dir={lock}", "--devices", "sim:0-3", timeout=120
    )
    text = result.stdout.str()
    assert result.ret == 0, text
    [setup], [teardown] = _lines(out / "setup.jsonl"), _lines(out / "teardown.jsonl")
    [base] = _lines(out / "base.jsonl")  # what it uses: set up in its process alone
    assert base["pid"] == setup["pid"]
    seen = records(out)
    assert len(seen) == 12
    workers = {r["pid"] for r in seen.values()}
    assert len(workers) > 1 and setup["pid"] not in workers  # several workers, none its own
    # Forked from the template of its users' kind, as their workers are: not a fresh start.
    assert setup["parent"] in {r["parent"] for r in seen.values()}
    for test in seen.values():
        assert test["said"] == "hello" and test["server"]["server"] == setup["server"]
        assert test["server"]["base"] == "base"
        assert setup["devices"] not in str(test["devices"]).split(",")  # its device: its own
    assert teardown["pid"] == setup["pid"]
    assert teardown["at"] >= max(float(r["end"]) for r in seen.values())  # after its last user
    assert not _alive(int(setup["pid"])) and not _alive(int(setup["server"]))
    record = _record(pytester)
    [start] = events(record, "session_start")
    assert setup["parent"] != start["pid"]  # a template's child, not the controller's
    [up], [down] = events(record, "once_setup"), events(record, "once_teardown")
    assert up["devices"] == down["devices"] == [int(setup["devices"])]
    assert up["ports"] == [setup["port"]] and up["outcome"] == "value"
    assert "ONCE server set up in" in text
    assert f"on sim:{setup['devices']}, port {setup['port']}" in text
    assert "ONCE server torn down in" in text


FAILING = """
import pytest


@pytest.fixture(scope="session")
def server():
    raise RuntimeError("no server today")
"""

FAILING_USERS = """
@pytest.mark.parametrize("i", range(3))
def test_uses(server, i):
    pass


def test_other():
    pass
"""


def _outcomes(pytester: pytest.Pytester, *args: str) -> dict[str, tuple[str, str]]:
    """Each test's outcome in JUnit, with the text of its error."""
    junit = pytester.path / "oracle.xml"
    pytester.runpytest_subprocess(*args, f"--junitxml={junit}", timeout=120)
    found = {}
    for case in ET.parse(junit).iter("testcase"):
        kinds = [c for c in case if c.tag in ("failure", "error", "skipped")]
        found[str(case.get("name"))] = (
            ",".join(c.tag for c in kinds) or "passed",
            "".join((c.text or "") for c in kinds),
        )
    return found


def test_a_failing_setup_gives_its_tests_plain_pytests_outcomes(
    pytester: pytest.Pytester, out: Path, lock: Path
) -> None:
    _project(pytester, out, "server = {}", FAILING)
    suite(pytester, out, "test_failing", FAILING_USERS)
    plain = _outcomes(pytester, "-p", "no:cacheprovider")  # devpool dormant: plain pytest
    devpool = (*IN_ORDER, f"--devpool-lock-dir={lock}", "--devices", "sim:0-1")
    under = _outcomes(pytester, *devpool)
    assert under == plain
    assert plain["test_uses[0]"][0] == "error" and "no server today" in plain["test_uses[0]"][1]


TEARDOWN_FAILS = """
import pytest


@pytest.fixture(scope="session")
def server():
    yield 1
    raise RuntimeError("could not stop the server")
"""

TEARDOWN_USERS = """
def test_a(server):
    pass


def test_b(server):
    pass
"""


def test_a_teardown_error_is_reported_as_plain_pytest_reports_it(
    pytester: pytest.Pytester, out: Path, lock: Path
) -> None:
    _project(pytester, out, "server = {}", TEARDOWN_FAILS)
    suite(pytester, out, "test_teardown", TEARDOWN_USERS)
    plain = _outcomes(pytester, "-p", "no:cacheprovider", "-p", "no:randomly")
    devpool = (*IN_ORDER, f"--devpool-lock-dir={lock}", "--devices", "sim:0-1")
    under = _outcomes(pytester, *devpool, "--devpool-max-parallel=1")
    assert under == plain
    assert plain["test_b"][0] == "error" and "could not stop the server" in plain["test_b"][1]


KILLED = """
import glob
import signal


def test_a_kill(server):
    os.kill(server, signal.SIGKILL)
    def lost():
        return any("once_lost" in Path(p).read_text() for p in glob.glob(".devpool/runs/*/*.jsonl"))

    wait_until(lost, "the run to see its once-fixture lost")


@pytest.mark.parametrize("i", range(4))
def test_b_after(server, i):
    pass


def test_c_other():
    pass
"""


def test_a_killed_once_process_ends_its_remaining_users_infra(
    pytester: pytest.Pytester, out: Path, lock: Path
) -> None:
    conftest = "import os\nimport pytest\n\n@pytest.fixture(scope='session')\ndef server():\n"
    _project(pytester, out, "server = { ports = 1 }", conftest + "    yield os.getpid()\n")
    suite(pytester, out, "test_killed", KILLED)
    result = pytester.runpytest_subprocess(
        *IN_ORDER, f"--devpool-lock-dir={lock}", "--devices", "sim:0-1",
        "--devpool-max-parallel=1", "-rA", timeout=120,
    )  # fmt: skip
    text = result.stdout.str()
    assert "2 passed, 4 infra" in text, text
    for i in range(4):
        assert f"INFRA test_killed.py::test_b_after[{i}] - once-fixture server's process" in text
    [lost] = events(_record(pytester), "once_lost")
    assert "killed by signal 9" in lost["why"]


MODULE_SCOPED = FAILING.replace('scope="session"', 'scope="module"')
UNKNOWN = "'servr' is not a session-scoped fixture of the collected suite; did you mean server?"


@pytest.mark.parametrize(
    ("table", "conftest", "said"),
    [
        ("servr = {}", FAILING, UNKNOWN),
        ("server = {}", MODULE_SCOPED, "'server' is a module-scoped fixture"),
        ("server = { ranks = 2 }", FAILING, "server has request key 'ranks', which it cannot"),
        ("server = { device_count = 9 }", FAILING, "server asks for 9 devices; this run has 2"),
    ],
    ids=["unknown", "module", "key", "too-big"],
)
def test_bad_once_tables_are_one_sentence_and_exit_4(
    pytester: pytest.Pytester, out: Path, lock: Path, table: str, conftest: str, said: str
) -> None:
    _project(pytester, out, table, conftest)
    suite(pytester, out, "test_failing", FAILING_USERS)
    result = pytester.runpytest_subprocess(
        *IN_ORDER, f"--devpool-lock-dir={lock}", "--devices", "sim:0-1", timeout=60
    )
    assert result.ret == 4
    error = [line for line in result.stderr.lines if line.startswith("ERROR")]
    assert len(error) == 1 and said in error[0], result.stderr.str()
    assert "Traceback" not in result.stderr.str()
    if "9 devices" in said:
        skipped = pytester.runpytest_subprocess(
            *IN_ORDER, f"--devpool-lock-dir={lock}", "--devices", "sim:0-1",
            "--devpool-skip-unsatisfiable", timeout=60,
        )  # fmt: skip
        assert "1 passed, 3 skipped" in skipped.stdout.str(), skipped.stdout.str()


def test_plain_pytest_runs_a_once_fixture_as_an_ordinary_one(
    pytester: pytest.Pytester, out: Path
) -> None:
    _project(pytester, out, "server = { device_count = 1, ports = 1 }", FAILING)
    suite(pytester, out, "test_failing", FAILING_USERS)
    result = pytester.runpytest_subprocess("-p", "devpool.plugin", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, errors=3)
    assert os.environ.get("DEVPOOL_ONCE_DIR") is None


STOPPED = """
def test_a_fails():
    assert 0


@pytest.mark.parametrize("i", range(8))
def test_uses(server, i):
    pass
"""


def test_a_run_stopped_by_x_tears_its_once_fixture_down_and_ends(
    pytester: pytest.Pytester, out: Path, lock: Path
) -> None:
    _project(pytester, out, "server = { device_count = 1, ports = 1 }", CONFTEST)
    suite(pytester, out, "test_stopped", STOPPED)
    result = pytester.runpytest_subprocess(
        *IN_ORDER, f"--devpool-lock-dir={lock}", "--devices", "sim:0-1", "-x", timeout=60
    )
    assert result.ret == 1 and "stopping after 1 failures" in result.stdout.str()
    [setup] = _lines(out / "setup.jsonl")
    assert len(_lines(out / "teardown.jsonl")) == 1
    assert not _alive(int(setup["pid"])) and not _alive(int(setup["server"]))


# A recording run: the once-fixture's code (its def block, the project code it calls, the
# module it imports only there, the file it reads) belongs to every test that uses it.
SELECTED = {
    "pyproject.toml": """
        [tool.pytest.ini_options]
        pythonpath = ["."]

        [tool.devpool.once]
        db = { device_count = 1 }
        """,
    ".gitignore": ".devpool/\n__pycache__/\nrunpytest-*\nstdout\nstderr\n",
    "helpers.py": """
        def make_db(rows):
            return {"rows": rows}


        def other():
            return 1
        """,
    "serving.py": """
        def start():
            return "up"
        """,
    "db.txt": "3\n",
    "tests/conftest.py": """
        from pathlib import Path

        import pytest


        @pytest.fixture(scope="session")
        def rows():
            return int((Path(__file__).parent.parent / "db.txt").read_text())
        """,
    "tests/test_users.py": """
        import os

        import pytest

        import helpers


        @pytest.fixture(scope="session")
        def db(rows):
            import serving  # imported in its process alone

            return helpers.make_db(rows) | {"state": serving.start(), "pid": os.getpid()}


        def test_one(db):
            assert db["rows"] == 3 and db["pid"] != os.getpid()


        def test_two(db):
            assert db["state"] == "up"


        def test_beside():
            pass
        """,
    "tests/test_others.py": """
        import helpers


        def test_other():
            assert helpers.other() == 1
        """,
}
USERS_OF_DB = {"tests/test_users.py::test_one", "tests/test_users.py::test_two"}


@pytest.mark.usefixtures("selective_env")
def test_a_change_to_a_once_fixtures_code_selects_its_users_and_no_other_test(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    from select_project import Run, git_project, record

    root = git_project(pytester.path, SELECTED)
    recorded = record(pytester, tmp_path, "sim:0-1")
    [setup] = [e for e in recorded.events if e["type"] == "once_setup"]  # run once, recorded
    others = {"tests/test_others.py::test_other", "tests/test_users.py::test_beside"}
    assert setup["outcome"] == "value" and recorded.ran == USERS_OF_DB | others
    edits = [
        ("helpers.py", "return {", "return {**{}, "),  # project code it called
        ("serving.py", 'return "up"', 'return "u" + "p"'),  # a module only its process loads
        ("db.txt", "3", "3 "),  # a file it read
        ("tests/test_users.py", '"pid": os', '"pid": 0 + os'),  # its def block
    ]
    for i, (name, old, new) in enumerate(edits):
        path = root / name
        original = path.read_text()
        path.write_text(original.replace(old, new))
        run = Run(pytester, tmp_path, f"on{i}", "--devices", "sim:0-1", "--devpool-select", "on")
        assert run.result.ret == 0, run.output()
        assert run.ran == USERS_OF_DB, (name, run.output())
        path.write_text(original)
    (root / "helpers.py").write_text((root / "helpers.py").read_text().replace("1", "2 - 1"))
    run = Run(pytester, tmp_path, "other", "--devices", "sim:0-1", "--devpool-select", "on")
    assert run.ran == {"tests/test_others.py::test_other"}, run.output()  # not its users


def test_its_lease_reaches_the_history_and_devpool_capacity(
    pytester: pytest.Pytester, out: Path, lock: Path
) -> None:
    import json
    import subprocess
    import sys

    conftest = "import pytest\n\n@pytest.fixture(scope='session')\ndef server():\n    return 1\n"
    _project(pytester, out, "server = { device_count = 1 }", conftest)
    suite(pytester, out, "test_lease", TEARDOWN_USERS)
    result = pytester.runpytest_subprocess(
        *IN_ORDER, f"--devpool-lock-dir={lock}", "--devices", "sim:0-1", timeout=60
    )
    assert result.ret == 0, result.stdout.str()
    [down] = events(_record(pytester), "once_teardown")
    capacity = subprocess.run(
        [sys.executable, "-m", "devpool.cli", "capacity", "--platform", "sim", "--format", "json"],
        cwd=pytester.path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert capacity.returncode == 0, capacity.stderr
    report = json.loads(capacity.stdout)
    [once] = report["once"]
    assert (once["name"], once["users"], once["from_history"]) == ("server", 2, True)
    assert once["held"] > 0 and down["seconds"] <= once["held"]  # setup to teardown
    assert report["totals"]["device_seconds"] >= once["device_seconds"] > 0


def _marked(conftest: str, mark: str) -> str:
    """The conftest with its fixture marked in code instead of the table."""
    marked = re.sub(
        r"(@pytest.fixture\(scope=\"\w+\"\)\ndef server)", f"@devpool.once{mark}\n\\1", conftest
    )
    assert marked != conftest
    return "import devpool\n" + marked


def test_the_marker_in_code_runs_a_fixture_once_as_the_table_does(
    pytester: pytest.Pytester, out: Path, lock: Path
) -> None:
    _project(pytester, out, "", _marked(CONFTEST, "(device_count=1, ports=1)"))
    suite(pytester, out, "test_one", USERS.format(n=4))
    result = pytester.runpytest_subprocess(
        *IN_ORDER, f"--devpool-lock-dir={lock}", "--devices", "sim:0-3", timeout=120
    )
    assert result.ret == 0, result.stdout.str()
    [setup], [teardown] = _lines(out / "setup.jsonl"), _lines(out / "teardown.jsonl")
    seen = records(out)
    assert len(seen) == 4 and setup["pid"] not in {r["pid"] for r in seen.values()}
    assert all(setup["devices"] not in str(r["devices"]).split(",") for r in seen.values())
    assert teardown["pid"] == setup["pid"] and "ONCE server set up in" in result.stdout.str()


def test_a_marked_failing_setup_gives_plain_pytests_outcomes(
    pytester: pytest.Pytester, out: Path, lock: Path
) -> None:
    _project(pytester, out, "", _marked(FAILING, ""))  # bare @devpool.once: no request
    suite(pytester, out, "test_failing", FAILING_USERS)
    plain = _outcomes(pytester, "-p", "no:cacheprovider")  # devpool dormant: plain pytest
    under = _outcomes(pytester, *IN_ORDER, f"--devpool-lock-dir={lock}", "--devices", "sim:0-1")
    assert under == plain and plain["test_uses[0]"][0] == "error"
    assert len(events(_record(pytester), "once_setup")) == 1  # it did run once


NOT_A_FIXTURE = FAILING + "\n\n@devpool.once(ports=1)\ndef helper():\n    pass\n"


@pytest.mark.parametrize(
    ("table", "conftest", "said"),
    [
        ("", _marked(FAILING, "(ranks=2)"), "conftest.py:6: @devpool.once on server has request "
         "key 'ranks', which it cannot take"),
        ("", _marked(MODULE_SCOPED, "()"), "@devpool.once on 'server' is a module-scoped fixture"),
        ("", _marked(FAILING, "(device_count=9)"), "@devpool.once on server asks for 9 devices"),
        ("", "import devpool\n" + NOT_A_FIXTURE, "conftest.py:11: @devpool.once on 'helper' is not "
         "a session-scoped fixture"),
        ("server = {}", _marked(FAILING, "()"), "server is named both by @devpool.once and in"),
    ],
    ids=["key", "module", "too-big", "not-a-fixture", "both"],
)  # fmt: skip
def test_bad_markers_are_one_sentence_and_exit_4_and_nothing_under_plain_pytest(
    pytester: pytest.Pytester, out: Path, lock: Path, table: str, conftest: str, said: str
) -> None:
    _project(pytester, out, table, conftest)
    suite(pytester, out, "test_failing", FAILING_USERS)
    result = pytester.runpytest_subprocess(
        *IN_ORDER, f"--devpool-lock-dir={lock}", "--devices", "sim:0-1", timeout=60
    )
    assert result.ret == 4
    error = [line for line in result.stderr.lines if line.startswith("ERROR")]
    assert len(error) == 1 and said in error[0], result.stderr.str()
    assert "Traceback" not in result.stderr.str()
    if "ranks" in said:  # once (a session each): under plain pytest, an ordinary fixture
        plain = pytester.runpytest_subprocess("-p", "devpool.plugin", "-p", "no:cacheprovider")
        plain.assert_outcomes(passed=1, errors=3)
