"""A device test's CPU load: how many cores its process and its children kept busy.

The scheduler gives a device test that keeps cores busy CPU slots as well as devices
(plan/jobs.cpu_slots_of), so that on a host with fewer cores than devices, CPU-heavy
device tests (a model trained on a simulated device, an OpenMP pool per test) do not run
more at once than the cores can carry, while tests that wait on their devices still use
every device.

What a test needs, not what it got: under contention a thread's CPU time shrinks to its
share of the cores, so CPU time alone would call four tests spinning on two cores half a
core each. The kernel also counts, per thread, the time it waited on a run queue
(/proc/self/task/TID/schedstat: nanoseconds on a CPU, then nanoseconds runnable but
waiting). The load is, over the test's wall time: the process's CPU time (threads that
ended included) and its children's that were reaped during the test
(torch.multiprocessing.spawn's ranks), plus the time its threads waited for a core. A
thread that ended during the test took its counts along: its waiting is taken at the rate
the live threads waited per second they ran. Where schedstat is not readable, waiting is
not counted.
"""

from __future__ import annotations

import resource
import time

from devpool.worker.native_threads import task_ids


def _threads() -> dict[int, tuple[int, int]]:
    """(nanoseconds on a CPU, nanoseconds waiting for one) of each live thread, since it
    started."""
    found: dict[int, tuple[int, int]] = {}
    for tid in task_ids():  # none without /proc: CPU time alone
        try:
            with open(f"/proc/self/task/{tid}/schedstat", "rb") as file:
                ran, waited = file.read().split()[:2]
            found[tid] = (int(ran), int(waited))
        except (OSError, ValueError):
            continue  # the thread ended meanwhile
    return found


class Meter:
    """Measures one test at a time: start() at its first line, load() after its teardown."""

    def __init__(self) -> None:
        self._started: tuple[float, float, float, dict[int, tuple[int, int]]] | None = None

    def start(self) -> None:
        own, children = _cpu()
        self._started = (time.monotonic(), own, children, _threads())

    def load(self) -> float | None:
        """Cores the test kept busy or waiting, on average over its wall time; None when
        it was not started or took no measurable time."""
        if self._started is None:
            return None
        began, own_before, children_before, threads = self._started
        self._started = None
        wall = time.monotonic() - began
        if wall <= 0:
            return None
        own, children = _cpu()
        own, children = max(0.0, own - own_before), max(0.0, children - children_before)
        ran = waited = 0
        for tid, (run_ns, wait_ns) in _threads().items():
            run_before, wait_before = threads.get(tid, (0, 0))
            ran += max(0, run_ns - run_before)
            waited += max(0, wait_ns - wait_before)
        rate = waited / ran if ran > 0 else 0.0  # seconds waited per second run
        ended = max(0.0, own - ran / 1e9)  # CPU time of threads that ended meanwhile
        return (own + children + waited / 1e9 + ended * rate) / wall


def _cpu() -> tuple[float, float]:
    """CPU seconds of this process (every thread, ended ones too) and of its reaped children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime
