"""Does `devpool capacity` predict the next run's wall? (issue 28: estimates include start-up)

For each suite: two untimed runs write the duration history and the runs' fixed costs;
then `devpool capacity --format json` predicts the wall of one runner (totals.wall_seconds),
and the next run is timed. Target: predicted within ±15% of measured.

Suites: the demo suite (examples/, 28 tests on sim:0-7), an ML-shaped sim suite
(ml_suite.py's, 1 s import) and a CPU suite (20 modules of 100 small tests).

    python benchmarks/capacity_accuracy.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import PYTEST, suite_root, timed
from ml_suite import files as ml_files

ROOT = Path(__file__).resolve().parent.parent

CPU_MODULE = """
import pytest


@pytest.mark.parametrize("i", range(100))
def test_small(i):
    assert sum(range(2000)) > i
"""

PYPROJECT = '[tool.devpool]\ndevices = "sim:0-7"\nlock-dir = "{lock}"\n'


def predict(root: Path) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVPOOL_", "PYTEST_"))}
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from devpool.cli import main; sys.exit(main())"]
        + ["capacity", "--format", "json", "--devices-per-runner", "8", "."],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(json.loads(done.stdout)["totals"]["wall_seconds"])


def suites(folder: Path) -> dict[str, Path]:
    demo = folder / "demo"
    shutil.copytree(ROOT / "examples", demo / "examples")
    (demo / "pytest.ini").write_text("[pytest]\n")
    (folder / "ml").mkdir()
    ml = suite_root(folder / "ml", ml_files(1.0))
    (folder / "cpu").mkdir()
    cpu = suite_root(folder / "cpu", {f"test_m{k:02d}.py": CPU_MODULE for k in range(20)})
    out = {"demo suite": demo, "ML-shaped suite": ml, "CPU suite": cpu}
    for root in out.values():
        (root / "pyproject.toml").write_text(PYPROJECT.format(lock=folder / "locks"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="devpool-capacity-") as tmp:
        for name, root in suites(Path(tmp)).items():
            argv = [*PYTEST]
            timed(argv, root)  # the history
            timed(argv, root)  # and a run's fixed cost
            ratios = []
            for _ in range(args.repeat):
                predicted = predict(root)
                measured = timed(argv, root)
                ratios.append(predicted / measured)
                print(f"  {name}: predicted {predicted:.1f} s, measured {measured:.1f} s")
            value = statistics.median(ratios)
            verdict = "met" if abs(value - 1) <= 0.15 else "MISSED"
            print(f"{name}: predicted / measured = {value:.2f} (target 0.85–1.15: {verdict})")


if __name__ == "__main__":
    main()
