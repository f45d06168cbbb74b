"""A lock file that another user removes while a run holds it never gives two holders.

The other user is uid 65534 (nobody), acted as by a child process that drops to it; the
lock folder is sticky, so the kernel itself lets that user remove only its own files.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from child_processes import spawn
from devpool.devices import lockdir
from devpool.devices.leases import Blocked, Holder, Lease, _Handle
from devpool.devices.lockdir import LockDir

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root (to own a lock file as another user, uid 65534)"
)

OTHER = 65534
CAP = {0: 100}


@pytest.fixture
def shared() -> Iterator[Path]:
    """A lock folder, mode 1777, in a place the other user can reach."""
    parent = Path(tempfile.mkdtemp(prefix="devpool-removed-", dir="/tmp"))
    os.chmod(parent, 0o755)
    folder = parent / "locks"
    LockDir(folder)
    try:
        yield folder
    finally:
        subprocess.run(["rm", "-rf", str(parent)], check=False, timeout=30)


def plant(folder: Path) -> Path:
    """sim-0.lock, made by the other user (mode 0666, as a run of theirs makes it)."""
    path = folder / "sim-0.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
    os.fchmod(fd, 0o666)
    os.fchown(fd, OTHER, OTHER)
    os.close(fd)
    return path


def whole(folder: Path, session: str) -> Lease | list[Blocked]:
    return LockDir(folder).try_acquire("sim", [0], Holder.for_this_process(session))


def part(folder: Path, session: str, amount: int = 50) -> Lease | list[Blocked]:
    holder = Holder.for_this_process(session)
    return LockDir(folder).try_acquire_memory("sim", [0], amount, CAP, holder)


def test_the_device_stays_held_through_a_new_lock_file_whoever_made_it(shared: Path) -> None:
    path = plant(shared)
    first = whole(shared, "first")
    assert isinstance(first, Lease)
    path.unlink()  # the other user removes their file

    # The run that makes the new file sees the marker; so does every run after it, which
    # finds a file of this user's own (the old code looked only when it made the file).
    for _ in range(3):
        got = whole(shared, "second")
        assert isinstance(got, list) and got[0].holder == first.holder, got
        got = part(shared, "third")
        assert isinstance(got, list) and got[0].holder == first.holder, got
    assert [name for name in os.listdir(shared) if ".held-" in name] != []

    first.release()
    assert not [name for name in os.listdir(shared) if ".held-" in name]
    second = whole(shared, "second")
    assert isinstance(second, Lease)
    second.release()


def test_partial_holders_of_a_removed_lock_file_keep_whole_holders_out(shared: Path) -> None:
    path = plant(shared)
    first = part(shared, "first")
    assert isinstance(first, Lease)
    path.unlink()

    for _ in range(2):
        got = whole(shared, "second")
        assert isinstance(got, list) and got[0].shares and got[0].holder == first.holder, got
    beside = part(shared, "third")  # partial holders share, through either file
    assert isinstance(beside, Lease)
    beside.release()

    first.release()
    second = whole(shared, "second")
    assert isinstance(second, Lease)
    second.release()


def test_a_lock_file_removed_before_the_marker_is_made_is_given_up(
    shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window between locking and the marker: the holder makes its marker, then checks
    the name; removed meanwhile, it holds nothing and leaves no marker behind."""
    plant(shared)
    made = lockdir.new_marker

    def removed_meanwhile(folder: Path, platform: str, device: int, holder: Holder) -> _Handle:
        (folder / f"{platform}-{device}.lock").unlink()
        return made(folder, platform, device, holder)

    monkeypatch.setattr(lockdir, "new_marker", removed_meanwhile)
    got = whole(shared, "first")
    assert got == [Blocked(0, None)]
    assert os.listdir(shared) == []
    monkeypatch.undo()
    lease = whole(shared, "second")
    assert isinstance(lease, Lease)
    lease.release()


# Until `stop` exists: remove sim-0.lock (the sticky folder lets this user remove only its
# own) and make it anew, as fast as it can.
REMOVER = """
import os, sys
from pathlib import Path
folder = Path(sys.argv[1])
os.setgid(65534)
os.setuid(65534)
path, stop, removed = folder / "sim-0.lock", folder.parent / "stop", 0
print("up", flush=True)  # the takers start now: on a loaded host they could be done first
while not stop.exists():
    try:
        os.unlink(path)
        removed += 1
    except OSError:
        pass
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666))
    except OSError:
        pass
print(removed, flush=True)
"""

# Rounds of: take sim:0 whole or in part, write a guard, check the guards present, remove
# the guard, release. Holding the lease while another holds it whole is a violation.
TAKER = """
import json, os, random, sys, time
from pathlib import Path
from devpool.devices.leases import Holder
from devpool.devices.lockdir import LockDir
folder, guards, seed = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
rng, locks, held = random.Random(seed), LockDir(folder), 0
for turn in range(int(sys.argv[4])):
    holder, whole = Holder.for_this_process(f"run{seed}", f"t::{turn}"), rng.random() < 0.5
    if whole:
        got = locks.try_acquire("sim", [0], holder)
    else:
        got = locks.try_acquire_memory("sim", [0], 40, {0: 100}, holder)
    if isinstance(got, list):
        time.sleep(rng.random() * 0.001)
        continue
    held += 1
    guard = guards / f"guard-{os.getpid()}-{turn}"
    guard.write_text(json.dumps({"whole": whole}))
    time.sleep(rng.random() * 0.002)
    present = []
    for path in guards.glob("guard-*"):
        try:
            present.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            pass
    if len(present) > 1 and any(g["whole"] for g in present) or len(present) > 2:
        (guards / f"violation-{os.getpid()}-{turn}").write_text(json.dumps(present))
    guard.unlink()
    got.release()
print(held, flush=True)
"""


def test_a_user_removing_the_lock_file_in_a_loop_never_gives_two_holders(
    shared: Path, tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    guards = tmp_path / "guards"
    guards.mkdir()
    remover = spawn(children, ["-c", REMOVER, str(shared)])
    assert remover.stdout is not None and remover.stdout.readline() == "up\n"
    takers = [
        spawn(children, ["-c", TAKER, str(shared), str(guards), str(seed), "300"])
        for seed in range(4)
    ]
    held = [int(taker.communicate(timeout=120)[0]) for taker in takers]
    (shared.parent / "stop").touch()
    removed = int(remover.communicate(timeout=30)[0])

    violations = [json.loads(p.read_text()) for p in guards.glob("violation-*")]
    assert not violations, violations[:3]
    assert sum(held) > 20 and removed > 20, (held, removed)  # the test tried something
