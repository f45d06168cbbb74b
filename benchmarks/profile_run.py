"""Where a devpool run spends its CPU: py-spy samples of the controller and of every worker.

Run: python benchmarks/profile_run.py [--suite modules20] [--rate 200] [--top 15]
     python benchmarks/profile_run.py --folder PATH [--pytest-arg=--deselect=ID ...]

Runs one devpool command on a CPU suite under `py-spy record` (py-spy is in the `[dev]`
extra), attaching another py-spy to each worker as it appears (`--subprocesses` does not
follow the fork server's forks), and prints, per role (controller, workers together), the
samples on CPU and the main threads' functions with the most samples, by own time and by
inclusive time. py-spy samples only threads on CPU (no `--idle`), so a worker waiting for
its next batch counts nothing: compare a role's samples with the run's wall time to see
how busy it was. A loaded host inflates every role's samples alike.
`--folder` profiles a suite already on disk, in place (its own configuration applies;
history and locks go to a temporary folder), as `xdist_pairs.py --folder` times it.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

from common import PYTEST, devpool_options, suite_root
from cpu_suites import SUITES


def _frame_name(frame: str) -> str:
    """'replay (devpool/replay.py:71)' → 'devpool/replay.py:replay' (file and function)."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = Path(path).parts
    short = "/".join(parts[-2:]) if parts else path
    return f"{short}:{name}"


def _descendants(root: int) -> set[int]:
    """Every process below `root`, from /proc (a fork server's children included)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def record(argv: list[str], cwd: Path, state: Path, rate: int) -> list[tuple[str, Path]]:
    """Sample the controller, and each worker as it appears: py-spy's --subprocesses does
    not follow processes forked by the fork server (templates, and the workers they fork)."""
    spy = ["py-spy", "record", "--format", "raw", "-r", str(rate), "--nonblocking"]
    out = state / "controller.txt"
    controller = subprocess.Popen(
        [*spy, "-o", str(out), "--", *argv],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    files, watchers = [("controller", out)], []
    seen: set[int] = set()
    while controller.poll() is None:
        for pid in _descendants(controller.pid) - seen:
            if _comm(pid) == "devpool-worker":
                seen.add(pid)
                path = state / f"worker-{pid}.txt"
                files.append(("workers", path))
                watchers.append(
                    subprocess.Popen(
                        [*spy, "-o", str(path), "--pid", str(pid)],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
        time.sleep(0.01)
    for watcher in watchers:
        watcher.wait(timeout=60)
    return [(role, path) for role, path in files if path.exists()]


def summarize(raws: list[tuple[str, Path]], rate: int, top: int) -> None:
    """Print own-time and inclusive-time tables per role from py-spy's raw output."""
    own: dict[str, Counter[str]] = {"controller": Counter(), "workers": Counter()}
    incl: dict[str, Counter[str]] = {"controller": Counter(), "workers": Counter()}
    total: Counter[str] = Counter()
    for role, raw in raws:
        for line in raw.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
            if not frames or frames[0].startswith("Thread._bootstrap"):
                # Other threads: pytest-rerunfailures' status server waits in accept(),
                # which py-spy counts as busy; the main thread is where the run's work is.
                continue
            n = int(count)
            total[role] += n
            own[role][_frame_name(frames[-1])] += n
            for name in {_frame_name(f) for f in frames}:
                incl[role][name] += n
    for role in ("controller", "workers"):
        print(f"{role}: {total[role]} samples on CPU ({total[role] / rate:.2f} s)")
        print("  own time:")
        for name, n in own[role].most_common(top):
            print(f"    {n / max(1, total[role]):6.1%}  {name}")
        print("  inclusive (devpool and pytest frames):")
        shown = [
            (name, n)
            for name, n in incl[role].most_common()
            if "devpool/" in name
            or "_pytest/" in name
            or "pluggy/" in name
            or name.startswith(("run/", "worker/", "report/", "session/", "backends/"))
        ]
        for name, n in shown[:top]:
            print(f"    {n / max(1, total[role]):6.1%}  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=list(SUITES), default="modules20")
    parser.add_argument("--rate", type=int, default=200, help="samples per second")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--folder", type=Path, help="an existing suite to profile in place")
    parser.add_argument("--pytest-arg", action="append", default=[], metavar="ARG")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="devpool-profile-") as tmp:
        state = Path(tmp)
        if args.folder is not None:
            root = args.folder.resolve()
        else:
            root = suite_root(state, SUITES[args.suite][1])
        history = state / "history.sqlite"
        argv = [*PYTEST, *devpool_options(state, "sim:0-1", history), "--devpool-cpu-slots", "2"]
        argv += args.pytest_arg
        # warm history; exit 1 (failing tests) still primes it
        subprocess.run(argv, cwd=root, capture_output=True, check=False)
        start = time.perf_counter()
        raws = record(argv, root, state, args.rate)
        name = root if args.folder is not None else args.suite
        print(f"{name}: one warm devpool run, {time.perf_counter() - start:.2f} s wall")
        summarize(raws, args.rate, args.top)


if __name__ == "__main__":
    main()
