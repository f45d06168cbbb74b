"""Partial device leases by memory, across real processes: sums, exclusion, SIGKILL, races."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from child_processes import SRC, read_line, spawn
from devpool.devices.leases import Blocked, Holder, Lease, describe_blockers
from devpool.devices.lockdir import LockDir

CAP = {0: 100, 1: 100}

# Holds `amount` of the given devices (or them whole, amount 0) until stdin closes.
CHILD_HOLDS = """
import sys
from pathlib import Path
from devpool.devices.leases import Holder
from devpool.devices.lockdir import LockDir
folder, amount = Path(sys.argv[1]), int(sys.argv[3])
devices = [int(d) for d in sys.argv[2].split(",")]
locks, holder = LockDir(folder), Holder.for_this_process("child", "t::child")
if amount:
    got = locks.try_acquire_memory("sim", devices, amount, {d: 100 for d in devices}, holder)
else:
    got = locks.try_acquire("sim", devices, holder)
print("ready" if not isinstance(got, list) else "blocked", flush=True)
sys.stdin.read()
"""

# Many rounds of: take a partial or a whole lease of sim:0, write a guard file with what
# was declared, check every guard present against the capacity, remove the guard, release.
# Two of the processes end by SIGKILL while holding, at a random round (their guard removed
# first: the lease is not).
CHILD_STRESS = """
import json, os, random, signal, sys, time
from pathlib import Path
from devpool.devices.leases import Holder
from devpool.devices.lockdir import LockDir
folder, guards = Path(sys.argv[1]), Path(sys.argv[2])
rounds, seed = int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed)
crash_at = rng.randrange(rounds // 2, rounds) if seed < 2 else -1
locks = LockDir(folder)
go = guards / "go"
deadline = time.monotonic() + 30
while not go.exists() and time.monotonic() < deadline:
    time.sleep(0.001)
def attempt(turn, whole, amount):
    holder = Holder.for_this_process(f"run{seed}", f"t::{turn}")
    if whole:
        got = locks.try_acquire("sim", [0], holder)
    else:
        got = locks.try_acquire_memory("sim", [0], amount, {0: 100}, holder)
    if isinstance(got, list):
        time.sleep(rng.random() * 0.002)  # refused: back off a little, as the scheduler does
        return False
    guard = guards / f"guard-{os.getpid()}-{turn}"
    guard.write_text(json.dumps({"whole": whole, "amount": 100 if whole else amount}))
    present = []
    for path in guards.glob("guard-*"):
        try:
            present.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            pass  # removed (or being written) right now
    wholes = sum(1 for g in present if g["whole"])
    total = sum(g["amount"] for g in present if not g["whole"])
    if (wholes and len(present) > 1) or total > 100:
        (guards / f"violation-{os.getpid()}-{turn}").write_text(json.dumps(present))
    seen = {"whole": whole, "present": len(present)}
    (guards / f"seen-{os.getpid()}-{turn}").write_text(json.dumps(seen))
    time.sleep(rng.random() * 0.003)
    guard.unlink()
    if turn >= crash_at >= 0:  # the first lease it holds from that round on
        os.kill(os.getpid(), signal.SIGKILL)  # holding the lease: the kernel must free it
    got.release()
    return True
for turn in range(rounds):
    attempt(turn, rng.random() < 0.25, rng.choice([10, 20, 30, 45, 60]))
# Partial holders can starve whole ones under load (as they may in a real run), so every
# survivor ends by waiting for one whole lease: each run sees both kinds, whatever the timing.
deadline = time.monotonic() + 60
while not attempt(rounds, True, 100) and time.monotonic() < deadline:
    pass
"""


def holder(job: str = "tests/test_x.py::test_a") -> Holder:
    return Holder.for_this_process("s1", job)


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def memory(path: Path, devices: list[int], amount: int) -> Lease | list[Blocked]:
    return LockDir(path).try_acquire_memory("sim", devices, amount, CAP, holder())


def whole(path: Path, devices: list[int]) -> Lease | list[Blocked]:
    return LockDir(path).try_acquire("sim", devices, holder())


def can(got: Lease | list[Blocked]) -> bool:
    if isinstance(got, Lease):
        got.release()
        return True
    return False


def test_partial_leases_share_a_device_up_to_its_capacity(lock_dir: Path) -> None:
    first = memory(lock_dir, [0], 60)
    second = memory(lock_dir, [0], 40)
    assert isinstance(first, Lease) and isinstance(second, Lease)
    assert first.amount == 60 and first.devices == (0,)

    over = memory(lock_dir, [0], 1)
    assert isinstance(over, list) and over[0].free == 0
    assert sorted(share.amount for share in over[0].shares) == [40, 60]
    assert "sim:0 shared: " in describe_blockers("sim", over) and "(0 B left)" in (
        describe_blockers("sim", over)
    )

    second.release()
    assert can(memory(lock_dir, [0], 40))
    assert not can(memory(lock_dir, [0], 41))


def test_partial_and_whole_exclude_each_other(lock_dir: Path) -> None:
    part = memory(lock_dir, [0], 10)
    assert isinstance(part, Lease)
    blocked = whole(lock_dir, [0, 1])
    assert isinstance(blocked, list) and [b.device for b in blocked] == [0]
    assert [s.amount for s in blocked[0].shares] == [10]  # named with its amount
    part.release()

    held = whole(lock_dir, [0])
    assert isinstance(held, Lease)
    refused = memory(lock_dir, [0], 1)
    assert isinstance(refused, list) and refused[0].holder == held.holder
    assert not refused[0].shares
    held.release()
    assert can(memory(lock_dir, [0], 100))


def test_multi_device_partial_lease_is_all_or_nothing(lock_dir: Path) -> None:
    on_one = memory(lock_dir, [1], 90)
    assert isinstance(on_one, Lease)
    refused = memory(lock_dir, [0, 1], 20)
    assert isinstance(refused, list) and [b.device for b in refused] == [1]
    assert can(memory(lock_dir, [0], 100))  # nothing left behind on device 0
    assert not any(p.name.startswith("sim-0.share-") for p in lock_dir.iterdir())


def test_status_lists_partial_holders_with_amounts(lock_dir: Path) -> None:
    lease = memory(lock_dir, [0], 30)
    assert isinstance(lease, Lease)
    lease.set_job("tests/test_y.py::test_b", worker_pid=4321)
    (state,) = [s for s in LockDir(lock_dir).status() if s.device == 0]
    assert not state.held
    (share,) = state.shares
    assert share.amount == 30 and share.holder is not None
    assert (share.holder.job, share.holder.worker_pid) == ("tests/test_y.py::test_b", 4321)
    lease.release()
    assert all(not s.shares for s in LockDir(lock_dir).status())


def test_a_sigkilled_partial_holder_frees_its_share(
    lock_dir: Path, children: list[subprocess.Popen[str]]
) -> None:
    child = spawn(children, ["-c", CHILD_HOLDS, str(lock_dir), "0", "60"], stdin=True)
    assert read_line(child, timeout=20.0) == "ready"
    refused = memory(lock_dir, [0], 50)
    assert isinstance(refused, list)
    assert refused[0].holder is not None and refused[0].holder.pid == child.pid
    assert not can(whole(lock_dir, [0]))
    assert can(memory(lock_dir, [0], 40))

    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)
    assert can(memory(lock_dir, [0], 100))
    assert can(whole(lock_dir, [0]))
    # The dead holder's record was stale and the next acquirer removed it.
    assert not any(p.name.startswith("sim-0.share-") for p in lock_dir.iterdir())


def test_a_sigkilled_whole_holder_frees_the_device_for_partial_leases(
    lock_dir: Path, children: list[subprocess.Popen[str]]
) -> None:
    child = spawn(children, ["-c", CHILD_HOLDS, str(lock_dir), "0", "0"], stdin=True)
    assert read_line(child, timeout=20.0) == "ready"
    assert not can(memory(lock_dir, [0], 1))
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)
    assert can(memory(lock_dir, [0], 100))


def test_a_worker_inheriting_the_fds_keeps_the_share(
    lock_dir: Path, children: list[subprocess.Popen[str]]
) -> None:
    lease = memory(lock_dir, [0], 70)
    assert isinstance(lease, Lease)
    child = spawn(
        children, ["-c", "import sys; sys.stdin.read()"], pass_fds=tuple(lease.fds()), stdin=True
    )
    lease.release(unlock=False)
    assert not can(memory(lock_dir, [0], 31))
    assert not can(whole(lock_dir, [0]))
    child.kill()
    child.wait(timeout=10)
    assert wait_until(lambda: can(memory(lock_dir, [0], 100)))


def test_concurrent_adds_never_oversubscribe(
    lock_dir: Path, tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    """Processes that all try to add 60 of 100 at the same moment: exactly one gets it."""
    for round_ in range(3):
        folder = lock_dir / str(round_)
        procs = [
            spawn(children, ["-c", CHILD_HOLDS, str(folder), "0", "60"], stdin=True)
            for _ in range(5)
        ]
        answers = sorted(read_line(proc, timeout=20.0) for proc in procs)
        assert answers == ["blocked"] * 4 + ["ready"], answers
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=10)


def test_mixed_concurrent_holders_never_exceed_capacity_nor_overlap_whole(
    lock_dir: Path, tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    guards = tmp_path / "guards"
    guards.mkdir()
    LockDir(lock_dir)
    procs = [
        spawn(
            children, ["-c", CHILD_STRESS, str(lock_dir), str(guards), "150", str(seed)], stdin=True
        )
        for seed in range(6)
    ]
    (guards / "go").touch()
    codes = [proc.wait(timeout=120) for proc in procs]
    assert codes == [-signal.SIGKILL] * 2 + [0] * 4

    violations = [p.read_text() for p in guards.glob("violation-*")]
    assert not violations, violations[:3]
    seen = [json.loads(p.read_text()) for p in guards.glob("seen-*")]
    assert any(s["whole"] for s in seen) and any(not s["whole"] for s in seen)
    shared_at_once = max(s["present"] for s in seen)
    assert shared_at_once >= 2, "partial leases never overlapped: the test proved nothing"
    # Whatever happened, SIGKILLed holders included, everything is free again.
    assert can(memory(lock_dir, [0], 100)) and can(whole(lock_dir, [0]))


def test_devpool_locks_and_doctor_show_partial_holders(
    lock_dir: Path, children: list[subprocess.Popen[str]]
) -> None:
    child = spawn(children, ["-c", CHILD_HOLDS, str(lock_dir), "1", "60"], stdin=True)
    assert read_line(child, timeout=20.0) == "ready"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, "-m", "devpool.cli"]
    locks = subprocess.run(
        [*command, "locks", "--lock-dir", str(lock_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    ).stdout
    assert "sim:1        shared by 1:" in locks
    assert f"60 B by pid {child.pid} (user " in locks and "test t::child" in locks
    doctor = subprocess.run(
        [*command, "doctor", "--lock-dir", str(lock_dir), "--timeout", "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    ).stdout
    assert "1 shared" in doctor
    assert f"sim:1 shared: 60 B by pid {child.pid}" in doctor
