"""Device tests that keep cores busy take CPU slots (issue 28): on a host with fewer cores
than devices, a run with history never runs more CPU-bound work at once than its cores,
while tests that wait on their devices still use every device. Read from the run records
of real sessions: each test's measured load, the cores it was given, and when it ran."""

from __future__ import annotations

from pathlib import Path

import pytest
from sessions import FAST, events

from devpool.plan.jobs import CPU_BOUND

SUITE = """
import hashlib
import threading
import time

import pytest


def hashing(blocks):
    block = b"x" * (1 << 20)
    for _ in range(blocks):
        hashlib.sha256(block).digest()  # releases the GIL: one core per thread


@pytest.mark.device_count(1)
@pytest.mark.parametrize("i", range(4))
def test_busy(i):
    other = threading.Thread(target=hashing, args=(150,))
    other.start()
    hashing(150)
    other.join()


@pytest.mark.device_count(1)
@pytest.mark.parametrize("i", range(6))
def test_waits(i):
    # Long beside the test's own setup and teardown, whose waits for a core on a loaded host
    # count too: 0.4 s measured over 0.3 when the host was busy.
    time.sleep(1.0)


@pytest.mark.parametrize("i", range(3))
def test_cpu(i):
    hashing(50)
"""


def ends(record: Path) -> list[dict]:
    return [e for e in events(record, "job_end") if not e.get("retried")]


def test_cpu_bound_device_tests_take_cores_from_their_second_run_on(
    pytester: pytest.Pytester, lock: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(test_mix=SUITE)
    args = (*FAST, f"--devpool-lock-dir={lock}", "--devices", "sim:0-7", "--devpool-cpu-slots=2")
    plain = pytester.runpytest_subprocess("-p", "no:devpool", "-p", "no:cacheprovider")
    first = pytester.runpytest_subprocess(*args, timeout=180)
    assert first.ret == plain.ret == 0, first.stdout.str()
    [record] = pytester.path.glob(".devpool/runs/*/record.jsonl")
    loads = {e["test"]: e.get("cpu_load") for e in ends(record)}
    busy = {t for t in loads if "test_busy" in t}
    waiting = {t for t in loads if "test_waits" in t}
    # Measured in every device test's worker; two hashing threads want two cores, whether
    # the cores were free or not (waiting for one counts). CPU-only tests are not measured.
    # The waiting tests stay below the load that takes cores, however loaded the host (their
    # setup and teardown waiting for a core count); the busy ones are far above it.
    assert all(loads[t] is not None and loads[t] >= 1.2 for t in busy), ("busy", loads)
    assert all(loads[t] is not None and loads[t] < CPU_BOUND for t in waiting), ("waits", loads)
    assert all(loads[t] is None for t in loads if "test_cpu" in t), ("cpu", loads)
    assert not any("cores" in e for e in ends(record))  # no history yet: no test took cores
    record.unlink()

    second = pytester.runpytest_subprocess(*args, timeout=180)
    assert second.ret == 0, second.stdout.str()
    [record] = pytester.path.glob(".devpool/runs/*/record.jsonl")
    done = ends(record)
    cores = {e["test"]: e.get("cores", 1 if "test_cpu" in e["test"] else 0) for e in done}
    assert all(cores[t] >= 1 for t in busy) and not any(cores[t] for t in waiting), cores
    spans = [(e["start"], e["end"], cores[e["test"]], e["test"]) for e in done]
    for start, _, _, _ in spans:
        running = [s for s in spans if s[0] <= start < s[1]]
        # At no test's start do the tests running then hold more cores than there are.
        assert sum(s[2] for s in running) <= 2, running
    # The waiting tests still ran beside the busy ones: devices were not held back for cores.
    beside = [
        s
        for s in spans
        if s[3] in waiting and any(b[0] < s[1] and s[0] < b[1] for b in spans if b[3] in busy)
    ]
    assert beside, spans
    assert sorted(e["outcome"] for e in done) == ["passed"] * 13
