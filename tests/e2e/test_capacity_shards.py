"""End to end: `devpool capacity`, `devpool shard` and `devpool history` as a CI owner runs them.

Each test runs the `devpool` command in a subprocess and checks what a user sees: the exit
status, the numbers, the one-sentence errors.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from devpool.capacity.shards import select, shard_item
from devpool.history.durations import History, TestResult
from devpool.plan.markers import Request

REPO = Path(__file__).resolve().parents[2]
DEVPOOL = (sys.executable, "-m", "devpool.cli")
FAST = ("-p", "no:hypothesispytest")  # pytest's own options go after `--`, with the paths
T0 = 1_700_000_000.0


def devpool(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "DEVPOOL_"))}
    return subprocess.run(
        [*DEVPOOL, *args], cwd=cwd, env=environ, capture_output=True, text=True, timeout=120
    )


def test_capacity_of_the_examples(tmp_path: Path) -> None:
    # Run from an empty folder so no history of this checkout changes the estimates.
    done = devpool(tmp_path, "capacity", "--platform", "sim", "--", str(REPO / "examples"), *FAST)
    assert done.returncode == 0, done.stderr
    lines = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line.strip()}
    # devices, enabled, quarantined, disabled, other platform, device-s, wall...
    assert lines["cpu"][1:6] == ["9", "0", "0", "0", "0.0"]
    assert lines["1"][1:6] == ["13", "0", "0", "1", "13.0"]
    assert lines["2"][1:6] == ["5", "0", "0", "0", "10.0"]  # 3 device_count(2), 2 ranks(2)
    assert lines["4"][1:6] == ["2", "0", "0", "0", "8.0"]
    assert lines["8"][1:6] == ["1", "0", "0", "0", "8.0"]
    assert lines["total"][1:6] == ["30", "0", "0", "1", "39.0"]
    assert "examples/test_platforms.py::test_cuda_graphs_capture" in done.stdout


def test_capacity_json_and_markdown_with_timeline(tmp_path: Path) -> None:
    examples = str(REPO / "examples")
    done = devpool(tmp_path, "capacity", "--platform", "sim", "--format", "json", "--", examples)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["schema"] == "devpool-capacity/1"
    assert data["totals"]["tests"] == 31
    assert data["skipped_by_platform"] == ["examples/test_platforms.py::test_cuda_graphs_capture"]
    done = devpool(
        tmp_path, "capacity", examples, "--platform", "sim", "--format", "markdown", "--timeline"
    )
    assert done.returncode == 0, done.stderr
    assert "<details open><summary>Timeline" in done.stdout
    assert "| 8 |" in done.stdout


@pytest.mark.parametrize(
    ("args", "sentence"),
    [
        (("--platform", "tpu"), "--platform 'tpu' is not a known platform"),
        (("--runner-class", "big"), "--runner-class 'big' is not NAME=DEVICES"),
        (("--history", "nowhere.sqlite"), "--history nowhere.sqlite does not exist"),
    ],
)
def test_capacity_bad_input_is_one_sentence(
    tmp_path: Path, args: tuple[str, ...], sentence: str
) -> None:
    done = devpool(tmp_path, "capacity", str(REPO / "examples"), *args)
    assert done.returncode == 4
    assert done.stderr.startswith(f"devpool: error: {sentence}")
    assert done.stderr.count("\n") == 1


def write_suite(root: Path, seed: int = 5, count: int = 36) -> dict[str, tuple[int, float]]:
    """A suite of tests with known durations (recorded in a history, not slept)."""
    rng = random.Random(seed)
    known: dict[str, tuple[int, float]] = {}
    lines = ["import pytest", ""]
    for i in range(count):
        devices = rng.choice([0, 1, 1, 2, 4])
        name = f"test_{i:02d}"
        if devices:
            lines.append(f"@pytest.mark.device_count({devices})")
        lines += [f"def {name}(): pass", ""]
        known[f"test_suite.py::{name}"] = (devices, round(rng.uniform(5.0, 40.0), 2))
    (root / "test_suite.py").write_text("\n".join(lines))
    return known


def record_history(path: Path, known: dict[str, tuple[int, float]]) -> None:
    with History(path) as history:
        history.add(
            TestResult(nodeid, "passed", seconds, "sim", devices, "sim-8", T0 + run, f"r{run}")
            for run in range(3)
            for nodeid, (devices, seconds) in known.items()
        )


def test_shard_three_runners_balanced_and_complete(pytester: pytest.Pytester) -> None:
    known = write_suite(pytester.path)
    history = pytester.path / "timings.sqlite"
    record_history(history, known)
    done = devpool(
        pytester.path, "shard", "--runners", "3", "--history", str(history), "--format", "json"
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["shards"] == 3
    assert data["estimates_from_history"] == len(known)
    walls = [shard["wall_seconds"] for shard in data["split"]]
    assert max(walls) - min(walls) <= 0.10 * max(walls), walls
    members = [set(shard["tests"]) for shard in data["split"]]
    assert set().union(*members) == set(known)
    assert sum(len(m) for m in members) == len(known)  # no test in two shards
    # `pytest --devpool-shard K/3` computes membership with shards.select on the same items.
    items = [shard_item(n, Request(d), s) for n, (d, s) in known.items()]
    order = sorted(known)
    assert [select(order, items, k, 3) for k in (1, 2, 3)] == members
    assert [shard["command"] for shard in data["split"]] == [
        f"python -m pytest --devpool-shard={k}/3" for k in (1, 2, 3)
    ]


def test_shard_text_and_budget(pytester: pytest.Pytester) -> None:
    known = write_suite(pytester.path)
    history = pytester.path / "timings.sqlite"
    record_history(history, known)
    total = sum(max(d, 1) * s for d, s in known.values())
    budget = int(total / 8 / 2 * 1.15)  # two runners of 8 devices fit, with little room
    done = devpool(
        pytester.path, "shard", "test_suite.py", "--budget", f"{budget}s", "--history", str(history)
    )
    assert done.returncode == 0, done.stderr
    assert "in 2 shards on runners of 8 devices" in done.stdout
    assert "python -m pytest --devpool-shard=2/2 test_suite.py" in done.stdout
    assert "warning: the slowest shard is estimated at" in done.stderr

    longest = max(s for _, s in known.values())
    done = devpool(pytester.path, "shard", "--budget", "10s", "--history", str(history))
    assert done.returncode == 4
    assert "needs" in done.stderr and "alone on 8 devices; the budget is 10 s" in done.stderr
    assert longest > 10


def test_shard_bad_budget_is_one_sentence(pytester: pytest.Pytester) -> None:
    write_suite(pytester.path, count=3)
    done = devpool(pytester.path, "shard", "--budget", "45 parsecs")
    assert done.returncode == 4
    assert done.stderr == (
        "devpool: error: budget '45 parsecs' is not a duration like 45m, 1h30m or 90s\n"
    )


def test_history_export_and_merge_between_runners(tmp_path: Path) -> None:
    runner1, runner2 = tmp_path / "runner1", tmp_path / "runner2"
    runner1.mkdir()
    runner2.mkdir()
    with History(runner1 / ".devpool" / "history.sqlite") as history:
        history.add(
            [
                TestResult("t.py::a", "passed", 3.0, "cuda", 1, "cuda-8", T0, "r1"),
                TestResult("t.py::b", "passed", 8.0, "cuda", 2, "cuda-8", T0, "r1"),
            ]
        )
    done = devpool(runner1, "history", "export", str(tmp_path / "timings.jsonl"))
    assert done.returncode == 0, done.stderr
    assert "exported 2 results" in done.stdout
    for expected in ("merged 2 new results", "merged 0 new results"):
        done = devpool(runner2, "history", "merge", str(tmp_path / "timings.jsonl"))
        assert done.returncode == 0, done.stderr
        assert expected in done.stdout
    with History(runner2 / ".devpool" / "history.sqlite") as history:
        assert history.estimates() == {"t.py::a": 3.0, "t.py::b": 8.0}


def test_corrupt_history_is_one_sentence(tmp_path: Path) -> None:
    bad = tmp_path / "history.sqlite"
    bad.write_bytes(b"garbage" * 1000)
    done = devpool(tmp_path, "history", "export", "out.jsonl", "--history", str(bad))
    assert done.returncode == 4
    assert done.stderr == (
        f"devpool: error: {bad} is not a devpool history (file is not a database)\n"
    )
    done = devpool(tmp_path, "history", "export", "out.jsonl")
    assert done.returncode == 4
    assert "there is no history at" in done.stderr


def test_shard_leaves_out_tests_of_other_platforms(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_p="""
        import pytest

        @pytest.mark.platforms(["cuda"])
        def test_cuda(): pass

        def test_any(): pass
        """
    )
    done = devpool(
        pytester.path, "shard", "--runners", "1", "--platform", "sim", "--format", "json"
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["split"][0]["tests"] == ["test_p.py::test_any"]


SHARD_SUITE = """
import time

import pytest

SECONDS = {durations!r}


@pytest.mark.device_count(1)
@pytest.mark.parametrize("i", range(len(SECONDS)))
def test_work(i):
    time.sleep(SECONDS[i])
"""


def test_shards_run_for_real_take_what_they_were_estimated(tmp_path: Path) -> None:
    """Record durations once, split into 3 shards, run each shard on its own simulated runner:
    every shard runs exactly its tests, and the shards' measured test time agrees with the
    balanced estimate (each within 10% of the others, give or take scheduling noise)."""
    durations = [0.3, 0.25, 0.2, 0.2, 0.15, 0.15, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05]
    (tmp_path / "test_shardwork.py").write_text(SHARD_SUITE.format(durations=durations))
    history = tmp_path / "history.sqlite"
    common = [
        "-p", "no:cacheprovider", *FAST, "-q", "--devices", "sim:0",
        f"--devpool-lock-dir={tmp_path / 'locks'}", f"--devpool-history={history}",
    ]  # fmt: skip
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "DEVPOOL_"))}

    def pytest_run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pytest", *common, *extra], cwd=tmp_path, env=environ,
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip

    first = pytest_run(f"--devpool-run-record={tmp_path / 'all.jsonl'}")
    assert first.returncode == 0, first.stdout + first.stderr

    ran: list[set[str]] = []
    busy: list[float] = []
    for k in (1, 2, 3):
        # Each CI runner starts from the same history (merged before the run, as the
        # README says); a shard's own run must not change how the others split.
        own = tmp_path / f"history{k}.sqlite"
        shutil.copy(history, own)
        record = tmp_path / f"shard{k}.jsonl"
        done = pytest_run(
            f"--devpool-shard={k}/3", f"--devpool-run-record={record}", f"--devpool-history={own}"
        )
        assert done.returncode == 0, done.stdout + done.stderr
        ends = [
            json.loads(line)
            for line in record.read_text().splitlines()
            if '"type": "job_end"' in line
        ]
        ran.append({e["nodeid"] for e in ends})
        busy.append(sum(e["run_time"] for e in ends))

    everything = {f"test_shardwork.py::test_work[{i}]" for i in range(len(durations))}
    assert set().union(*ran) == everything
    assert sum(len(names) for names in ran) == len(everything)  # no test in two shards
    # One device per runner: a shard's wall is its tests' summed time. LPT on these
    # durations balances to 0.57/0.57/0.56 s; allow 10% plus 0.05 s of timer noise.
    assert max(busy) - min(busy) <= 0.10 * max(busy) + 0.05, busy
