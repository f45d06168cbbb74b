"""`devpool run --log FILE` (issue 46): the terminal in a file, pytest's exit code kept.

`devpool run ... | tee log` hands a step tee's status unless the shell has pipefail; with
`--log` no pipe is needed. Real processes: the wrapper, pytest, its workers, and plain
pytest on the same suite for the exit code and the counts.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

FAST = ("-p", "no:hypothesispytest", "-p", "no:cacheprovider", "-p", "no:randomly")
DEVPOOL = (sys.executable, "-m", "devpool.cli")
_CALLER_ONLY = ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "DEVPOOL_SUMMARY_BY_PARENT", "CI")

SUITE = """
import pytest


@pytest.mark.device_count(1)
def test_ok():
    print("printed-by-ok")


def test_bad():
    assert 1 == 2, "log-marker"
"""


def _env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in _CALLER_ONLY}
    return {**base, **extra}


def _project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "tests").mkdir(parents=True)
    (root / "tests" / "test_s.py").write_text(SUITE, encoding="utf-8")
    (root / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = []\n")
    return root


def _shell(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`bash -e -c COMMAND`, as GitHub runs a step's `run:` by default."""
    return subprocess.run(
        ["bash", "-e", "-c", command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
    )


def _quoted(argv: list[str] | tuple[str, ...]) -> str:
    return " ".join(f"'{part}'" for part in argv)


def _counts(text: str) -> str:
    """pytest's closing counts, without the time: `1 failed, 1 passed`."""
    found = re.findall(r"=+ (\d+ \w+(?:, \d+ \w+)*) in [\d.]+s", text)
    assert found, text
    return str(found[-1])


def test_the_log_holds_the_terminal_and_the_step_gets_pytests_code(tmp_path: Path) -> None:
    root = _project(tmp_path)
    plain = _shell(_quoted([sys.executable, "-m", "pytest", "tests", *FAST]), root, _env())
    assert plain.returncode == 1, plain.stdout

    pytest_args = ["tests", "--devices", "sim:0-1", f"--devpool-lock-dir={tmp_path / 'L'}", *FAST]
    log = tmp_path / "run.log"
    terminal = tmp_path / "terminal.txt"
    command = _quoted([*DEVPOOL, "run", f"--log={log}", "--", *pytest_args])
    wrapped = _shell(f"{command} >'{terminal}' 2>&1", root, _env())
    assert wrapped.returncode == plain.returncode, terminal.read_text()
    written = log.read_text(encoding="utf-8")
    # Everything the terminal got, byte for byte, pytest's and devpool run's own lines.
    assert written == terminal.read_text(encoding="utf-8")
    assert _counts(written) == _counts(plain.stdout)
    assert "log-marker" in written and "devpool run: exit code 1" in written

    # devpool off (no --devices): still pytest's code, and the file.
    off_log = tmp_path / "off.log"
    command = _quoted([*DEVPOOL, "run", f"--log={off_log}", "--", "tests", *FAST])
    off = _shell(f"{command} >'{terminal}' 2>&1", root, _env())
    assert off.returncode == plain.returncode, terminal.read_text()
    assert off_log.read_text(encoding="utf-8") == terminal.read_text(encoding="utf-8")
    assert _counts(off_log.read_text(encoding="utf-8")) == _counts(plain.stdout)


def test_a_pipe_under_github_actions_is_named_once(tmp_path: Path) -> None:
    root = _project(tmp_path)
    summary = tmp_path / "summary.md"
    argv = [*DEVPOOL, "run", "--", "tests", "--devices", "sim:0-1"]
    argv += [f"--devpool-lock-dir={tmp_path / 'L'}", *FAST]
    piped = f"{_quoted(argv)} | cat"
    github = _env(GITHUB_ACTIONS="true", GITHUB_STEP_SUMMARY=str(summary))
    in_actions = _shell(piped, root, github)
    assert in_actions.returncode == 0, "without pipefail the pipeline's status is cat's"
    assert in_actions.stderr.count("set -o pipefail") == 1, in_actions.stderr
    # With pipefail the step fails as pytest did; outside GitHub Actions nothing is said.
    failing = _shell(f"set -o pipefail; {piped}", root, github)
    assert failing.returncode == 1
    assert "pipefail" not in _shell(piped, root, _env()).stderr
    # No pipe, no line: stdout to a file.
    to_file = _shell(f"{_quoted(argv)} >'{tmp_path / 'out.txt'}'", root, github)
    assert to_file.returncode == 1 and "pipefail" not in to_file.stderr


def test_a_log_that_cannot_be_written_is_one_sentence(tmp_path: Path) -> None:
    root = _project(tmp_path)
    where = tmp_path / "no-such-folder" / "run.log"
    command = _quoted([*DEVPOOL, "run", f"--log={where}", "--", "tests", *FAST])
    done = _shell(command, root, _env())
    assert done.returncode == 4
    assert done.stderr.strip().splitlines() == [
        f"devpool: error: devpool run --log={where}: cannot write it: No such file or directory"
    ]
    assert "Traceback" not in done.stdout + done.stderr
