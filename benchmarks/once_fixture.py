"""A session fixture 40 tests share, which takes 3 s to set up (issue 57).

Plain pytest pays it once; `pytest -n 2` once per worker (twice); devpool with two
workers and the fixture under [tool.devpool.once] once, in a process of its own. The
fixture's 3 s are CPU work (building an index, compiling kernels), and each test does
0.1 s of it too, so "paying it twice" costs what it costs on a shared host: cores.

Variants (alternated, `--repeat N` times): plain, xdist -n 2, devpool (--devices sim:0-1,
two workers). Printed: each one's wall and CPU seconds, and devpool against xdist.

    python benchmarks/once_fixture.py [--repeat 3] [--fixture-seconds 3] [--tests 40]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import PYTEST, Variant, alternate, devpool_options, show_ratio  # noqa: E402

SRC = Path(__file__).resolve().parent.parent / "src"

CONFTEST = """
import time

import pytest


def busy(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


@pytest.fixture(scope="session")
def index():
    busy({fixture_seconds})
    return {{"built": True}}
"""

TESTS = """
import pytest

from conftest import busy


@pytest.mark.parametrize("i", range({tests}))
def test_uses(index, i):
    busy(0.1)
    assert index["built"]
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--fixture-seconds", type=float, default=3.0)
    parser.add_argument("--tests", type=int, default=40)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "pyproject.toml").write_text(
            "[tool.pytest.ini_options]\n[tool.devpool.once]\nindex = {}\n"
        )
        (root / "conftest.py").write_text(CONFTEST.format(fixture_seconds=options.fixture_seconds))
        (root / "test_index.py").write_text(TESTS.format(tests=options.tests))
        env = {"PYTHONPATH": str(SRC)}
        devpool = [*PYTEST, "-p", "no:randomly"]
        devpool += devpool_options(root, "sim:0-1", root / "history.sqlite")
        devpool += ["--devpool-max-parallel=2"]
        variants = [
            Variant("plain pytest", [*PYTEST, "-p", "no:randomly"], env=env),
            Variant("xdist -n 2", [*PYTEST, "-p", "no:randomly", "-n", "2"], env=env),
            Variant("devpool, 2 workers, once", devpool, env=env),
        ]
        print(
            f"{options.tests} tests sharing a {options.fixture_seconds:g} s fixture "
            f"(CPU work), {options.repeat} repetition(s):"
        )
        alternate(variants, root, options.repeat)
        print(show_ratio(variants[2], variants[1], target=0.6))
        print(show_ratio(variants[2], variants[0]))


if __name__ == "__main__":
    main()
