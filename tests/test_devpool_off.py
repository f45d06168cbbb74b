"""devpool runs this suite (pyproject.toml), and the suite passes without it too.

A part of the suite that has a test of each kind (unit tests, in-process and subprocess
pytest sessions, the shared fixtures of tests/conftest.py) runs under plain pytest, with the
devpool plugin blocked, in a process of its own: no test may need devpool's scheduling, its
environment or its markers to pass. The whole suite under plain pytest is
`python -m pytest tests -p no:devpool` (docs/contributing.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PART = [
    "tests/test_config.py",  # unit tests, the options table
    "tests/plan/test_scheduler.py",  # unit tests with hypothesis
    "tests/devices/test_leases.py",  # real lock files, child processes
    "tests/worker/test_worklist.py",  # pytester sessions in this process
    "tests/e2e/test_isolation_module.py",  # real devpool sessions in subprocesses
]


def test_a_part_of_the_suite_passes_under_plain_pytest(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    environ = {name: value for name, value in os.environ.items() if name != "PYTEST_ADDOPTS"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:devpool", "-p", "no:cacheprovider"]
        + ["-q", f"--basetemp={tmp_path / 'base'}", f"--junitxml={junit}", *PART],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    # devpool was off: none of its lines (each begins "devpool:") in the run's output.
    said = [line for line in done.stdout.splitlines() if line.startswith("devpool:")]
    assert said == [], said
    cases = list(ElementTree.parse(junit).getroot().iter("testcase"))
    modules = {case.get("classname", "").split("::")[0] for case in cases}
    for part in PART:
        module = part.removesuffix(".py").replace("/", ".")
        assert any(name.startswith(module) for name in modules), f"no test of {part} ran"
    assert len(cases) >= 40, len(cases)
