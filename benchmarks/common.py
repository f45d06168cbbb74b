"""What the wall-clock benchmarks share: the pytest command, a private suite folder, and
timing of variants run alternately so that drift in machine load hits all of them alike."""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# Python writes bytecode caches on a user's machine, and pytest keeps its assertion-rewritten
# test modules and plugins there: every pytest these scripts start does so too, even where
# the shell sets PYTHONDONTWRITEBYTECODE (this sandbox does; a process that rewrites every
# module at each start measures the missing cache, once per process: the controller's and
# each template's collection). Figures before Dec 6 2026 were taken with it set; to take
# them so again, DEVPOOL_BENCH_BYTECODE=off sets it for every pytest the scripts start.
if os.environ.get("DEVPOOL_BENCH_BYTECODE") == "off":
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
else:
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# Unrelated plugins installed next to devpool would skew start-up time; leave them out.
PYTEST = [
    sys.executable,
    "-m",
    "pytest",
    "-q",
    "-p",
    "no:hypothesispytest",
    "-p",
    "no:benchmark",
    "-p",
    "no:cacheprovider",
]


def suite_root(root: Path, files: dict[str, str]) -> Path:
    """Write test files into `root` with an empty pytest.ini, so no outer config applies."""
    (root / "pytest.ini").write_text("[pytest]\n")
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def devpool_options(root: Path, devices: str, history: Path) -> list[str]:
    """--devices plus a private lock folder and duration history: no other run interferes.

    The paths are glued to their options (`--opt=PATH`): pytest guesses the rootdir and
    inifile before plugin options are known, so an existing PATH given as `--opt PATH`
    counts as a test path there; outside the suite's folder it moves the rootdir and
    drops the suite's own configuration (testpaths, addopts)."""
    return [
        "--devices",
        devices,
        f"--devpool-lock-dir={root / 'locks'}",
        f"--devpool-history={history}",
    ]


def timed(
    argv: list[str], cwd: Path, check: bool = True, extra_env: dict[str, str] | None = None
) -> float:
    """Seconds one pytest command takes; raises if it does not pass (unless check=False)."""
    # Run from inside a test session (the guard), the child must not inherit an outer
    # devpool or xdist worker's identity.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVPOOL_", "PYTEST_"))}
    env.update(extra_env or {})
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if check and done.returncode != 0:
        tail = (done.stdout + done.stderr)[-2000:]
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}:\n{tail}")
    return elapsed


@dataclass
class Variant:
    """One command to time; `prepare` runs before each timed run (e.g. to drop history)."""

    name: str
    argv: list[str]
    prepare: Callable[[], None] = lambda: None
    check: bool = True  # False: its tests may fail (timed all the same)
    env: dict[str, str] = field(default_factory=dict)  # added to the environment
    after: Callable[[], None] = lambda: None  # runs after each timed run (e.g. reads its record)
    runs: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # CPU seconds of the process tree

    @property
    def median(self) -> float:
        return statistics.median(self.runs)


def alternate(variants: list[Variant], cwd: Path, repeat: int) -> None:
    """Run every variant once per repetition, in turn, `repeat` times; print each row."""
    for _ in range(repeat):
        for variant in variants:
            variant.prepare()
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            variant.runs.append(timed(variant.argv, cwd, variant.check, variant.env))
            variant.after()
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            used = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
            variant.cpu.append(used)
    for variant in variants:
        shown = ", ".join(f"{s:.2f}" for s in variant.runs)
        print(
            f"  {variant.name:<30} median {variant.median:6.2f} s  "
            f"range {min(variant.runs):.2f}–{max(variant.runs):.2f}  runs: {shown}  "
            f"CPU median {statistics.median(variant.cpu):.2f} s"
        )


def ratio(top: Variant, bottom: Variant) -> tuple[float, float, float]:
    """Ratio of medians, and the min and max of the per-repetition ratios."""
    pairs = [a / b for a, b in zip(top.runs, bottom.runs, strict=True)]
    return top.median / bottom.median, min(pairs), max(pairs)


def show_ratio(top: Variant, bottom: Variant, target: float | None = None) -> str:
    """'A / B = 0.93x (per run 0.88–1.02)', with the verdict when a target is given."""
    value, low, high = ratio(top, bottom)
    text = f"  {top.name} / {bottom.name} = {value:.2f}x (per run {low:.2f}–{high:.2f})"
    if target is not None:
        verdict = "met" if value <= target else f"MISSED by {value / target - 1:.0%}"
        text += f"  target ≤ {target:.2f}x: {verdict}"
    return text
