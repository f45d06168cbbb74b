"""The edit-run loop (issue 28): devpool against plain pytest on the README's demo suite.

Three selections of examples/, each run by plain pytest (devpool installed but off: no
--devices, the tests run in the pytest process) and by devpool on --devices sim:0-7 with
the duration history of earlier runs (so the kinds a selection needs start collecting
beside the controller). Variants alternate within each repetition.

- one test, `examples/test_kernels.py::test_matmul[128-fp32]`: target ≤ plain + 0.3 s;
- one file of 12 one-device tests, `examples/test_kernels.py`: target ≤ 1.5x plain;
- the demo suite, `examples/`: target ≤ 2x plain.

    python benchmarks/small_selections.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from common import PYTEST, Variant, alternate, devpool_options, timed

ROOT = Path(__file__).resolve().parent.parent

SELECTIONS = {
    "one test": ["examples/test_kernels.py::test_matmul[128-fp32]"],
    "12 one-device tests": ["examples/test_kernels.py"],
    "the demo suite": ["examples"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="devpool-small-") as tmp:
        root = Path(tmp)
        shutil.copytree(ROOT / "examples", root / "examples")
        (root / "pytest.ini").write_text("[pytest]\n")
        history = root / "history.sqlite"
        devpool = devpool_options(root, "sim:0-7", history)
        timed([*PYTEST, *devpool, "examples"], root)  # the history; not counted
        results = []
        for name, paths in SELECTIONS.items():
            # Without devices the demo's device tests fail their own checks: timed all the same.
            plain = Variant(f"plain pytest, {name}", [*PYTEST, *paths], check=False)
            ours = Variant(f"devpool sim:0-7, {name}", [*PYTEST, *devpool, *paths])
            alternate([plain, ours], root, args.repeat)
            results.append((name, plain, ours))
    for name, plain, ours in results:
        extra = ours.median - plain.median
        ratio = ours.median / plain.median
        if name == "one test":
            verdict = "met" if extra <= 0.3 else "MISSED"
            print(f"{name}: devpool - plain = {extra:+.2f} s (target ≤ +0.30 s: {verdict})")
        else:
            target = 1.5 if name.startswith("12") else 2.0
            verdict = "met" if ratio <= target else "MISSED"
            print(f"{name}: devpool / plain = {ratio:.2f}x (target ≤ {target:g}x: {verdict})")


if __name__ == "__main__":
    main()
