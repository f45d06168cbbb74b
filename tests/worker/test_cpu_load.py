"""A device test's CPU load (worker/cpu_load.py), measured in a real process: threads that
keep cores busy, a child process's CPU, and a test that only waits."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import hashlib, json, resource, subprocess, sys, threading, time
    from devpool.worker.cpu_load import Meter

    def hashing(seconds):
        block = b"x" * (1 << 20)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            hashlib.sha256(block).digest()  # releases the GIL: a thread per core

    finished = threading.Event()

    def hashing_then_waiting(seconds):
        hashing(seconds)
        finished.wait()  # alive when the load is taken: its own counts are read

    def two_threads():
        other = threading.Thread(target=hashing_then_waiting, args=(0.6,))
        other.start()
        hashing(0.6)
        return other

    def two_threads_one_ended():
        other = threading.Thread(target=hashing, args=(0.6,))
        other.start()
        hashing(0.6)
        other.join()

    def child():
        subprocess.run([sys.executable, "-c", "x = sum(range(20_000_000))"], check=True)

    def children_cpu():
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        return used.ru_utime + used.ru_stime

    meter = Meter()
    loads = {}
    for name, work in [("two threads", two_threads), ("one ended", two_threads_one_ended),
                       ("child", child), ("sleep", lambda: time.sleep(0.5))]:
        cpu, began = children_cpu(), time.monotonic()
        meter.start()
        alive = work()
        loads[name] = meter.load()
        if alive is not None:
            finished.set()
            alive.join()
        if name == "child":  # what the child ran, over the wall, seen from outside the meter
            loads["child cpu"] = children_cpu() - cpu
            loads["child share"] = loads["child cpu"] / (time.monotonic() - began)
    print(json.dumps(loads))
    """
)


def test_threads_children_and_waiting_are_told_apart() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=True
    )
    loads = json.loads(out.stdout)
    # Two threads that each want a core: about 2, whether or not the cores were free (time
    # waiting for a core counts), never the half that CPU time alone shows under load.
    assert 1.5 <= loads["two threads"] <= 2.5, loads
    # One of them ended before the load was taken: its waiting is estimated at the rate the
    # live thread waited, so it still counts; under load the estimate may be over by the
    # difference of the two threads' rates (2.55 was seen), never as low as CPU time alone.
    assert 1.5 <= loads["one ended"] <= 3.0, loads
    # A child's CPU counts once it is reaped: what it ran over the wall time (about one core
    # on an idle host; its time waiting for a core is not seen, so less under load).
    assert loads["child cpu"] > 0.2, loads
    assert abs(loads["child"] - loads["child share"]) <= 0.1, loads
    assert loads["child"] <= 1.5, loads
    assert loads["sleep"] < 0.2, loads
