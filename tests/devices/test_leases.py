"""Device leases across real processes: flock semantics, holder records, folder safety."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from child_processes import read_line, spawn
from devpool.devices.leases import Blocked, Holder, Lease, describe_blockers
from devpool.devices.lockdir import FALLBACK_LOCK_DIR, LockDir, LockState, default_lock_dir
from devpool.errors import DevpoolError

CHILD_ACQUIRES = """
import sys, time
from pathlib import Path
from devpool.devices.leases import Holder
from devpool.devices.lockdir import LockDir
lease = LockDir(Path(sys.argv[1])).try_acquire(
    "sim", [int(d) for d in sys.argv[2].split(",")], Holder.for_this_process("child", "t::c")
)
print("ready" if not isinstance(lease, list) else "blocked", flush=True)
time.sleep(120)
"""


def holder(job: str = "tests/test_x.py::test_a", session: str = "s1") -> Holder:
    return Holder.for_this_process(session, job)


def acquired(result: Lease | list[Blocked]) -> Lease:
    assert isinstance(result, Lease), f"expected a lease, got {result}"
    return result


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def can_acquire(path: Path, devices: list[int]) -> bool:
    result = LockDir(path).try_acquire("sim", devices, holder("probe"))
    if isinstance(result, Lease):
        result.release()
        return True
    return False


# --- leases between open file descriptions and processes ---------------------------------


def test_second_lockdir_sees_blocked_with_holder_until_release(lock_dir: Path) -> None:
    mine = holder()
    lease = acquired(LockDir(lock_dir).try_acquire("sim", [3], mine))
    assert lease.devices == (3,) and lease.platform == "sim" and not lease.released

    assert LockDir(lock_dir).try_acquire("sim", [3], holder("other")) == [Blocked(3, mine)]

    lease.release()
    assert lease.released and lease.fds() == []
    lease.release()  # idempotent
    assert can_acquire(lock_dir, [3])


def test_all_or_nothing_leaves_no_device_held(lock_dir: Path) -> None:
    other = acquired(LockDir(lock_dir).try_acquire("sim", [1], holder("other")))

    result = LockDir(lock_dir).try_acquire("sim", [0, 1], holder())

    assert result == [Blocked(1, other.holder)]
    assert can_acquire(lock_dir, [0])
    other.release()
    assert can_acquire(lock_dir, [0, 1])


def test_reports_every_busy_device(lock_dir: Path) -> None:
    first = acquired(LockDir(lock_dir).try_acquire("sim", [1], holder("a")))
    second = acquired(LockDir(lock_dir).try_acquire("sim", [3], holder("b")))

    result = LockDir(lock_dir).try_acquire("sim", [3, 2, 1, 0], holder())

    assert result == [Blocked(1, first.holder), Blocked(3, second.holder)]
    assert can_acquire(lock_dir, [0, 2])


def test_lease_keeps_caller_device_order(lock_dir: Path) -> None:
    lease = acquired(LockDir(lock_dir).try_acquire("sim", [5, 2], holder()))
    assert lease.devices == (5, 2) and len(lease.fds()) == 2
    lease.release()


def test_duplicate_devices_are_rejected(lock_dir: Path) -> None:
    with pytest.raises(ValueError, match="duplicate"):
        LockDir(lock_dir).try_acquire("sim", [1, 1], holder())


def test_child_lease_blocks_until_child_is_sigkilled(
    lock_dir: Path, children: list[subprocess.Popen[str]]
) -> None:
    child = spawn(children, ["-c", CHILD_ACQUIRES, str(lock_dir), "0,1"])
    assert read_line(child) == "ready"

    result = LockDir(lock_dir).try_acquire("sim", [1], holder())
    assert isinstance(result, list) and [b.device for b in result] == [1]
    assert result[0].holder is not None and result[0].holder.pid == child.pid
    assert result[0].holder.job == "t::c"

    child.send_signal(signal.SIGKILL)
    assert wait_until(lambda: can_acquire(lock_dir, [0, 1]), timeout=1.0)


def test_inherited_fds_keep_lease_after_parent_closes_its_copy(
    lock_dir: Path, children: list[subprocess.Popen[str]]
) -> None:
    lease = acquired(LockDir(lock_dir).try_acquire("sim", [0, 1], holder()))
    # Popen returns after the exec, so the child already holds its copies of the fds.
    child = spawn(children, ["-c", "import time; time.sleep(120)"], pass_fds=tuple(lease.fds()))

    lease.release(unlock=False)

    assert not can_acquire(lock_dir, [0])
    assert not can_acquire(lock_dir, [1])
    child.kill()
    assert wait_until(lambda: can_acquire(lock_dir, [0, 1]), timeout=1.0)


def test_release_unlocks_even_while_a_child_holds_inherited_fds(
    lock_dir: Path, children: list[subprocess.Popen[str]]
) -> None:
    lease = acquired(LockDir(lock_dir).try_acquire("sim", [0], holder()))
    spawn(children, ["-c", "import time; time.sleep(120)"], pass_fds=tuple(lease.fds()))

    lease.release()

    assert can_acquire(lock_dir, [0])


def test_lock_fds_are_not_inherited_without_pass_fds(
    lock_dir: Path, children: list[subprocess.Popen[str]]
) -> None:
    lease = acquired(LockDir(lock_dir).try_acquire("sim", [0], holder()))
    spawn(children, ["-c", "import time; time.sleep(120)"])

    lease.release(unlock=False)

    assert can_acquire(lock_dir, [0])


# --- holder records and status -------------------------------------------------------------


def test_set_job_rewrites_the_record(lock_dir: Path) -> None:
    lease = acquired(LockDir(lock_dir).try_acquire("sim", [0, 1], holder("t::first")))

    lease.set_job("t::second", worker_pid=4300)

    states = LockDir(lock_dir).status()
    assert [(s.device, s.held) for s in states] == [(0, True), (1, True)]
    for state in states:
        assert state.holder is not None
        assert (state.holder.job, state.holder.worker_pid) == ("t::second", 4300)
    assert lease.holder.job == "t::second"
    lease.set_job("")  # a shorter record must not leave the old tail behind
    assert [s.holder and s.holder.job for s in LockDir(lock_dir).status()] == ["", ""]
    lease.release()
    with pytest.raises(RuntimeError, match="released"):
        lease.set_job("t::third")


def test_status_reports_held_free_and_ignores_foreign_files(lock_dir: Path) -> None:
    locks = LockDir(lock_dir)
    acquired(locks.try_acquire("cuda", [0], holder("t::gone"))).release()
    held = acquired(locks.try_acquire("sim", [2], holder("t::busy")))
    dashed = acquired(locks.try_acquire("my-sim", [10], holder("t::dash")))
    for name in ["README", "sim-x.lock", "sim-03.lock", "sim-4.lock.tmp", "cuda-1.lock~"]:
        (lock_dir / name).write_text("{}")
    (lock_dir / "sim-7.lock").mkdir()
    (lock_dir / "sim-8.lock").symlink_to(lock_dir / "README")

    states = LockDir(lock_dir).status()

    assert [(s.platform, s.device, s.held) for s in states] == [
        ("cuda", 0, False),
        ("my-sim", 10, True),
        ("sim", 2, True),
    ]
    assert states[0].holder is not None and states[0].holder.job == "t::gone"
    assert states[2] == LockState("sim", 2, True, held.holder)
    held.release()
    dashed.release()
    assert [s.held for s in LockDir(lock_dir).status()] == [False, False, False]


def test_status_of_an_empty_lock_file_has_no_holder(lock_dir: Path) -> None:
    locks = LockDir(lock_dir)
    locks.lock_path("sim", 0).touch()
    assert locks.status() == [LockState("sim", 0, False, None)]


def test_blocked_holder_is_none_when_record_is_garbage(lock_dir: Path) -> None:
    locks = LockDir(lock_dir)
    lease = acquired(locks.try_acquire("sim", [0], holder()))
    locks.lock_path("sim", 0).write_text("garbage")
    assert LockDir(lock_dir).try_acquire("sim", [0], holder()) == [Blocked(0, None)]
    lease.release()


def test_lock_files_are_world_writable_despite_umask(lock_dir: Path) -> None:
    old = os.umask(0o077)
    try:
        locks = LockDir(lock_dir)
        acquired(locks.try_acquire("sim", [0], holder())).release()
    finally:
        os.umask(old)
    assert stat.S_IMODE(locks.lock_path("sim", 0).stat().st_mode) == 0o666


# --- lock folder safety ----------------------------------------------------------------------


def test_folder_is_created_world_writable_and_sticky(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "locks"
    old = os.umask(0o077)
    try:
        locks = LockDir(path)
    finally:
        os.umask(old)
    assert locks.path == path
    assert stat.S_IMODE(path.stat().st_mode) == 0o1777
    assert stat.S_IMODE(path.parent.stat().st_mode) & 0o002 == 0
    LockDir(path)  # an existing folder is reused


def test_symlinked_folder_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "locks").symlink_to(real)
    with pytest.raises(DevpoolError, match="is a symlink; refusing to use it"):
        LockDir(tmp_path / "locks")


def test_dangling_symlinked_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "locks").symlink_to(tmp_path / "nowhere")
    with pytest.raises(DevpoolError, match="is a symlink"):
        LockDir(tmp_path / "locks")
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("dangling", [False, True])
def test_symlinked_lock_file_is_refused(lock_dir: Path, tmp_path: Path, dangling: bool) -> None:
    locks = LockDir(lock_dir)
    target = tmp_path / "target"
    if not dangling:
        target.write_text("precious")
    locks.lock_path("sim", 1).symlink_to(target)

    # A planted link is not waited for: it names the device as unusable, in one sentence.
    got = locks.try_acquire("sim", [0, 1], holder())
    assert isinstance(got, list) and [b.device for b in got] == [1]
    assert re.search(r"sim-1\.lock is a symlink", got[0].unusable or ""), got

    if dangling:
        assert not target.exists()
    else:
        assert target.read_text() == "precious"
    assert can_acquire(lock_dir, [0])  # the device locked before the error was let go


def test_folder_under_a_regular_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(DevpoolError, match="cannot be used: Not a directory"):
        LockDir(tmp_path / "file" / "locks")


def test_regular_file_as_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "locks").write_text("")
    with pytest.raises(DevpoolError, match="is not a folder"):
        LockDir(tmp_path / "locks")


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write to any folder")
def test_unwritable_folder_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "locks"
    path.mkdir(mode=0o555)
    try:
        with pytest.raises(DevpoolError, match="is not writable"):
            LockDir(path)
    finally:
        path.chmod(0o755)


def test_unusable_platform_name_is_refused(lock_dir: Path) -> None:
    with pytest.raises(DevpoolError, match="platform name"):
        LockDir(lock_dir).lock_path("../sim", 0)


def test_default_lock_dir_is_one_per_host_whatever_tmpdir(tmp_path: Path) -> None:
    """Two runs with different TMPDIRs (two runner services) choose the same folder."""
    code = "from devpool.devices.lockdir import default_lock_dir; print(default_lock_dir())"
    chosen = set()
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        env = dict(os.environ, TMPDIR=str(tmp_path / name))
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        chosen.add(done.stdout.strip())
    assert len(chosen) == 1, chosen
    assert not chosen.pop().startswith(str(tmp_path))


def test_default_lock_dir_takes_the_first_folder_every_user_may_write(tmp_path: Path) -> None:
    private, shared = tmp_path / "private", tmp_path / "shared"
    private.mkdir(mode=0o755)
    shared.mkdir()
    shared.chmod(0o1777)
    # A folder only some users may write would split runs by user: it is passed over.
    candidates = (private / "devpool", shared / "devpool")
    assert default_lock_dir(candidates) == shared / "devpool"
    # One that exists, open to all (as LockDir makes it), is taken even in a closed parent.
    (private / "devpool").mkdir()
    (private / "devpool").chmod(0o1777)
    assert default_lock_dir(candidates) == private / "devpool"
    # None usable: the fixed fallback, never $TMPDIR.
    assert default_lock_dir((tmp_path / "missing" / "devpool",)) == FALLBACK_LOCK_DIR
    assert Path("/tmp/devpool-locks") == FALLBACK_LOCK_DIR


# --- Holder and messages -------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "",
        "garbage",
        "[]",
        "{}",
        "null",
        '{"pid": "1", "host": "h", "session": "s", "job": "", "since": 1.0, "user": "u"}',
        '{"pid": true, "host": "h", "session": "s", "job": "", "since": 1.0, "user": "u"}',
        '{"pid": 1, "host": "h", "session": "s", "job": "", "since": "x", "user": "u"}',
        '{"pid": 1, "host": "h", "session": "s", "job": 3, "since": 1.0, "user": "u"}',
        '{"pid": 1, "host": "h", "session": "s", "job": "", "since": 1, "user": "u", '
        '"worker_pid": "9"}',
    ],
)
def test_from_json_returns_none_on_garbage(text: str) -> None:
    assert Holder.from_json(text) is None


def test_json_round_trip() -> None:
    original = Holder(1, "h", "s", "t::a", 12.5, "u", worker_pid=7)
    assert Holder.from_json(original.to_json()) == original
    assert Holder.from_json(Holder(1, "h", "s", "", 12, "u").to_json()) == Holder(
        1, "h", "s", "", 12.0, "u"
    )


def today_at(hour: int, minute: int, second: int) -> float:
    now = time.localtime()
    return time.mktime((now.tm_year, now.tm_mon, now.tm_mday, hour, minute, second, 0, 0, -1))


def test_describe() -> None:
    host = Holder.for_this_process("x").host
    h = Holder(
        4242, host, "20261129-1750-4242", "tests/test_x.py::test_a", today_at(17, 52, 1), "ci2"
    )
    assert h.describe() == (
        "pid 4242 (user ci2, session 20261129-1750-4242, test tests/test_x.py::test_a, "
        "since 17:52:01)"
    )
    idle = Holder(1, host, "s", "", today_at(9, 0, 0), "ci2")
    assert idle.describe() == "pid 1 (user ci2, session s, idle, since 09:00:00)"
    elsewhere = Holder(1, "other-host", "s", "t", today_at(9, 0, 0) - 3 * 86400, "ci2")
    assert elsewhere.describe().startswith("pid 1 on other-host (user ci2, session s, test t, ")
    assert elsewhere.describe().endswith(
        time.strftime("since %Y-%m-%d 09:00:00)", time.localtime(elsewhere.since))
    )


def test_describe_blockers() -> None:
    host = Holder.for_this_process("x").host
    h = Holder(4242, host, "S", "t::a", today_at(17, 52, 1), "ci2")
    text = describe_blockers("sim", [Blocked(3, h), Blocked(5, None)])
    assert text == (
        "sim:3 held by pid 4242 (user ci2, session S, test t::a, since 17:52:01); "
        "sim:5 held by an unknown holder"
    )
