"""The selection tests under Python >= 3.12, where recording watches code through
sys.monitoring (select/watch.py, Monitor), as this suite itself runs on 3.11.

The interpreter is named by DEVPOOL_TEST_PYTHON312 (.ci/run finds an installed one and
sets it), with pytest, hypothesis and devpool installed. Skipped where it is not set, except
in CI.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUITES = [
    "tests/select/test_select_watch.py",
    "tests/select/test_select_record.py",
    "tests/e2e/test_selective_runs.py",
]


def test_selection_records_and_selects_under_sys_monitoring(tmp_path: Path) -> None:
    python = os.environ.get("DEVPOOL_TEST_PYTHON312")
    if sys.version_info >= (3, 12):
        pytest.skip("this interpreter has sys.monitoring: the suite itself runs that watch")
    if not python:
        if os.environ.get("CI"):
            pytest.fail("DEVPOOL_TEST_PYTHON312 unset: .ci/run found no installed Python >= 3.12")
        pytest.skip("set DEVPOOL_TEST_PYTHON312 to a Python >= 3.12 with devpool's [dev] extra")
    version = subprocess.run(
        [python, "-c", "import sys; print(sys.version_info >= (3, 12))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert version.stdout.strip() == "True", f"{python} is older than 3.12"
    junit = tmp_path / "junit.xml"
    result = subprocess.run(
        # devpool off (pyproject.toml turns it on for this suite): the watch is tested in
        # these tests' own sessions, and this run keeps the outer run's folders alone.
        [python, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:devpool"]
        + [f"--junitxml={junit}", *SUITES],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    cases = ElementTree.parse(junit).getroot().iter("testcase")
    ran = {case.get("name", "") for case in cases if not list(case)}  # passed: no children
    monitored = {name for name in ran if "[monitoring]" in name}
    # The property test and each recorder case ran with the sys.monitoring watch.
    assert "test_a_watch_names_exactly_what_ran_and_what_an_import_ran[monitoring]" in monitored
    assert len(monitored) >= 7, sorted(monitored)
    assert any(name.startswith("test_an_edit_inside_one_function") for name in ran)
