"""At the keyboard: pytest's debugger under devpool, driven through a real terminal (pexpect).

Each scenario types the same keys into plain pytest and into devpool, in the same test,
and expects what plain pytest did: the exit status, the closing line's counts, what the
debugger answered. devpool's own promises are checked beside: the test's devices are
leased at the prompt, other workers' output waits until the prompt is left.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pexpect = pytest.importorskip("pexpect")

PLAIN = ("-p", "no:cacheprovider", "-p", "no:randomly", "--color=no", "-p", "pytest_timeout")
DEVPOOL = (*PLAIN, "-p", "devpool.plugin")
PROMPT = r"\((My)?Pdb\) "

SUITE = """
import os
import pdb
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def test_before():
    pass


def test_breakpoint():
    x = 41
    breakpoint()
    assert x == 41


def test_set_trace():
    x = 41
    pdb.set_trace()
    assert x == 41


def test_fails():
    x = 41
    assert x == 42


def test_break_again():
    x = 41
    breakpoint()
    y = x + 1
    assert y == 42


@pytest.mark.timeout(0.5)
def test_timeout_at_prompt():
    x = 41
    breakpoint()
    assert x == 41


@pytest.mark.device_count(1)
def test_on_a_device():
    x = 41
    (HERE / "at-prompt").write_text("")
    breakpoint()
    assert x == 41


@pytest.mark.device_count(1)
def test_beside():
    deadline = time.monotonic() + 60
    while not (HERE / "at-prompt").exists():
        assert time.monotonic() < deadline, "the other test never reached its prompt"
        time.sleep(0.02)


def test_input():
    assert input("name? ") == "bob"
"""

MY_PDB = """
import pdb


class MyPdb(pdb.Pdb):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.prompt = "(MyPdb) "
"""


# Plain pytest knows devpool's marker too: no unknown-mark warning counted in its closing line.
CONFTEST = """
def pytest_configure(config):
    config.addinivalue_line("markers", "device_count(n): devices the test needs")
"""


@dataclass
class Session:
    status: int | None
    text: str

    @property
    def counts(self) -> str:
        """The closing line's counts, without the time."""
        found = re.findall(r"=+ (.*?) in [\d.]+s", self.text)
        return found[-1] if found else ""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "test_keys.py").write_text(SUITE)
    (tmp_path / "mypdb.py").write_text(MY_PDB)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "locks").mkdir()
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    for name in ("CI", "GITHUB_ACTIONS", "PYTEST_ADDOPTS"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def drive(cwd: Path, args: list[str], keys: list[tuple[str, str]]) -> Session:
    """pytest on a terminal of its own: wait for each pattern, then type its keys
    (^C and ^D as the terminal sends them); then read to the end."""
    (cwd / "at-prompt").unlink(missing_ok=True)
    child = pexpect.spawn(
        sys.executable,
        ["-m", "pytest", *args],
        cwd=str(cwd),
        env=dict(os.environ),
        encoding="utf-8",
        timeout=60,
        dimensions=(40, 200),
    )
    seen = io.StringIO()
    child.logfile_read = seen
    for pattern, typed in keys:
        child.expect(pattern)
        if typed == "^C":
            child.sendintr()
        elif typed == "^D":
            child.sendeof()
        else:
            child.sendline(typed)
    child.expect(pexpect.EOF)
    child.close()
    return Session(child.exitstatus, seen.getvalue().replace("\r\n", "\n"))


def both(
    project: Path, args: list[str], keys: list[tuple[str, str]], devices: str = "sim:0"
) -> tuple[Session, Session]:
    """The same keys typed into plain pytest, then into devpool on these devices."""
    plain = drive(project, [*PLAIN, *args], keys)
    lock = f"--devpool-lock-dir={project / 'locks'}"
    devpool = drive(project, [*DEVPOOL, lock, f"--devices={devices}", *args], keys)
    return plain, devpool


ANSWER = [(PROMPT, "p x + 1"), ("42", ""), (PROMPT, "c")]
# A breakpoint set at the prompt, then `c`: the debugger stops there, at the keyboard again.
AGAIN = SUITE.splitlines().index("    assert y == 42") + 1
BREAK_AGAIN = [(PROMPT, f"b {AGAIN}"), (PROMPT, "c"), (PROMPT, "p y * 10"), ("420", ""),
               (PROMPT, "c")]  # fmt: skip


@pytest.mark.parametrize(
    "args, keys, said",
    [
        (["test_keys.py::test_set_trace"], [(PROMPT, "^C"), *ANSWER], "--KeyboardInterrupt--"),
        (["--pdb", "test_keys.py::test_fails"], ANSWER, "42"),
        (["--trace", "test_keys.py::test_before"], [(PROMPT, "c")], "PDB runcall"),
        (["--pdbcls=mypdb:MyPdb", "test_keys.py::test_breakpoint"], ANSWER, "(MyPdb) "),
        (["test_keys.py::test_breakpoint"], [(PROMPT, "^D")], "BdbQuit"),
        (["test_keys.py::test_break_again"], BREAK_AGAIN, "420"),
        (["test_keys.py::test_breakpoint", "test_keys.py::test_before"], [(PROMPT, "q")], "Quit"),
        (
            ["test_keys.py::test_timeout_at_prompt"],
            [(PROMPT, "import time; time.sleep(1)"), (PROMPT, "c")],
            "1 passed",
        ),
    ],
    ids=[
        "set_trace-ctrl-c",
        "pdb",
        "trace",
        "pdbcls-breakpoint",
        "ctrl-d",
        "break-again",
        "q",
        "timeout",
    ],
)
def test_each_way_into_the_debugger_works_as_in_plain_pytest(
    project: Path, args: list[str], keys: list[tuple[str, str]], said: str
) -> None:
    plain, devpool = both(project, args, keys)

    assert said in plain.text, plain.text
    assert said in devpool.text, devpool.text
    assert devpool.status == plain.status, devpool.text
    if plain.status == 2:  # q: the run ends as plain pytest's does, the test unfinished
        assert "Exit: Quitting debugger" in devpool.text, devpool.text
    else:
        assert devpool.counts == plain.counts, devpool.text


def test_a_breakpoint_in_a_parallel_run_has_the_terminal_and_its_devices(project: Path) -> None:
    keys = [(PROMPT, "p os.environ.get('DEVPOOL_DEVICES')"), (PROMPT, "p x + 1"),
            ("42", ""), (PROMPT, "c")]  # fmt: skip
    tests = ["test_keys.py::test_on_a_device", "test_keys.py::test_beside", "-v", "-s"]
    plain, devpool = both(project, tests, keys, devices="sim:0-1")

    assert devpool.status == plain.status == 0, devpool.text
    assert devpool.counts == plain.counts
    leased = re.search(r"p os.environ.get\('DEVPOOL_DEVICES'\)\n'(\d)'", devpool.text)
    assert leased, devpool.text
    # The test beside finished while the prompt was open: its line waited until it closed.
    at_prompt = devpool.text.split("PDB set_trace")[1].split("PDB continue")[0]
    assert "test_beside" not in at_prompt, devpool.text
    assert re.search(r"PASSED test_keys.py::test_beside", devpool.text.split("PDB continue")[1])
    assert "one stdin" in devpool.text  # -s: why input() reads no terminal here


def test_without_a_terminal_a_breakpoint_does_what_plain_pytest_does(project: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pytest", *args, "test_keys.py::test_breakpoint"],
            cwd=project,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )

    plain = run(*PLAIN)
    devpool = run(*DEVPOOL, f"--devpool-lock-dir={project / 'locks'}", "--devices=sim:0")

    assert devpool.returncode == plain.returncode == 1, devpool.stdout
    for seen in ("PDB set_trace (IO-capturing turned off)", "-> assert x == 41", "(Pdb) "):
        assert seen in plain.stdout and seen in devpool.stdout, devpool.stdout
    summary = [line for line in plain.stdout.splitlines() if line.startswith("FAILED ")]
    assert summary == ["FAILED test_keys.py::test_breakpoint - bdb.BdbQuit"]
    assert summary[0] in devpool.stdout.splitlines()


def test_with_s_input_reads_the_runs_stdin_when_one_test_runs(project: Path) -> None:
    args = ["-s", "test_keys.py::test_input"]
    plain = subprocess.run(
        [sys.executable, "-m", "pytest", *PLAIN, *args],
        cwd=project, input="bob\n", capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    devpool = subprocess.run(
        [sys.executable, "-m", "pytest", *DEVPOOL, f"--devpool-lock-dir={project / 'locks'}",
         "--devices=sim:0-1", *args],
        cwd=project, input="bob\n", capture_output=True, text=True, timeout=120,
    )  # fmt: skip

    assert devpool.returncode == plain.returncode == 0, devpool.stdout + devpool.stderr
    assert "1 passed" in devpool.stdout
