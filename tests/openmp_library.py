"""A real OpenMP (libgomp) library, built with the system's C compiler for a test: its pool
is what torch's CPU ops start, and a child forked after it ran hangs on its next parallel op.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SOURCE = """
double parallel_sum(int n) {
    double total = 0;
    #pragma omp parallel for reduction(+:total)
    for (int i = 0; i < n; i++) total += i * 0.5;
    return total;
}
"""


def build_openmp_library(folder: Path) -> Path:
    """libpar.so (parallel_sum) in folder; skips without a C compiler (fails under CI=true)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no C compiler (cc) to build the OpenMP library of this test")
        pytest.skip("no C compiler (cc) to build the OpenMP library of this test")
    (folder / "par.c").write_text(SOURCE)
    target = folder / "libpar.so"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-fopenmp", "-O1", "-o", str(target), str(folder / "par.c")],
        check=True,
    )
    return target
