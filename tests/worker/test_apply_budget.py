"""apply_budget in a process whose BLAS pool was loaded before its budget (a forked worker):
each library is sized by its own variable where the user set one, else by the budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("numpy")
pytest.importorskip("threadpoolctl")

PROGRAM = """
import json, os, numpy, threadpoolctl
from devpool.worker.threads import apply_budget
os.environ.update(json.loads(os.environ["LATER"]))  # set after numpy loaded, as at a fork
apply_budget()
print(json.dumps({i["internal_api"]: i["num_threads"] for i in threadpoolctl.threadpool_info()}))
"""


def pools(later: dict[str, str]) -> dict[str, int]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    env["LATER"] = json.dumps(later)
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_each_blas_takes_its_own_variable_else_the_budget() -> None:
    found = pools({})
    if "openblas" not in found:
        pytest.skip(f"numpy here ships no OpenBLAS: {found}")
    assert pools({"DEVPOOL_THREADS": "1"})["openblas"] == 1
    assert pools({"DEVPOOL_THREADS": "2"})["openblas"] == 2
    # the user's OpenBLAS variable wins over the budget; another library's does not touch it
    assert pools({"DEVPOOL_THREADS": "2", "OPENBLAS_NUM_THREADS": "1"})["openblas"] == 1
    assert pools({"DEVPOOL_THREADS": "1", "MKL_NUM_THREADS": "2"})["openblas"] == 1
