"""Job isolation at a fork's cost (issue 45): a worker forked from a warm template for each
test starts no thread of its own when its thread budget is its template's.

The conftest imports numpy, whose OpenBLAS pool the controller, and so the templates, hold.
Resizing that pool in every fork (threadpoolctl) started a new pool in each one, whose
threads spin before they sleep: a third of a job-isolated run's CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sessions import FAST

pytest.importorskip("numpy")

CONFTEST = """
import numpy  # noqa: F401 - its BLAS pool loads in the controller, before any budget
"""

TESTS = """
import json
import os
from pathlib import Path

import pytest


@pytest.mark.parametrize("n", range(4))
def test_threads_at_start(n):
    tasks = len(os.listdir("/proc/self/task"))
    seen = {{"pid": os.getpid(), "tasks": tasks, "budget": os.environ.get("OMP_NUM_THREADS")}}
    Path({out!r}, f"{{n}}.json").write_text(json.dumps(seen))
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_a_forked_test_process_starts_no_blas_pool(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    out = tmp_path / "seen"
    out.mkdir()
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_threads=TESTS.format(out=str(out)))
    result = pytester.runpytest_subprocess(
        *FAST,
        "--devices",
        "sim:0-1",
        "--devpool-cpu-slots=2",
        "--devpool-isolation=job",
        f"--devpool-lock-dir={tmp_path / 'locks'}",
        timeout=120,
    )
    result.assert_outcomes(passed=4)
    seen = [json.loads(path.read_text()) for path in sorted(out.glob("*.json"))]
    assert len({s["pid"] for s in seen}) == 4  # a process per test
    assert all(s["budget"] for s in seen), seen  # the budget reached each fork
    assert [s["tasks"] for s in seen] == [1, 1, 1, 1], seen
