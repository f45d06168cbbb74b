"""The shared lock folder is untrusted input: whatever another user plants there (a FIFO, a
symlink, a folder, a huge file, a record of the wrong types), every reader of it skips it
with one line naming it, and never hangs or raises (devices/untrusted.py and its users)."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devpool.devices.leases import Holder
from devpool.devices.lockdir import LockDir
from devpool.devices.untrusted import folder_problem
from devpool.devices.waiting_room import Waiter, WaitingRoom, fair_limit, read_waiters
from devpool.serve import device_views

KINDS = ["json", "fifo", "symlink", "folder", "huge", "socket", "binary"]


def plant(path: Path, kind: str, content: bytes = b"{}") -> None:
    """Put something of `kind` at `path`, as a hostile user could."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        os.symlink("/dev/zero", path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "huge":
        with open(path, "wb") as handle:
            handle.truncate(1 << 30)  # sparse: a gigabyte to read, none on disk
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        server.close()
    elif kind == "binary":
        path.write_bytes(b"\xff\xfe\x00" * 100)
    else:
        path.write_bytes(content)


def waiter_record(**fields: Any) -> dict[str, Any]:
    record: dict[str, Any] = dict(
        session="other", pid=os.getpid(), host=socket.gethostname(), platform="sim"
    )
    record.update(since=time.time() - 5, wants=1)
    record.update(fields)
    return record


field_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
)


@pytest.mark.timeout(120)
@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    kind=st.sampled_from(KINDS),
    field=st.sampled_from(["pid", "since", "wants", "session", "host", "platform", "worker_pid"]),
    value=field_values,
    raw=st.one_of(st.none(), st.binary(max_size=64)),
)
def test_every_reader_of_the_shared_folder_skips_what_is_planted(
    tmp_path_factory: pytest.TempPathFactory,
    kind: str,
    field: str,
    value: object,
    raw: bytes | None,
) -> None:
    lock = tmp_path_factory.mktemp("lock")
    os.chmod(lock, 0o1777)
    locks = LockDir(lock)
    held = locks.try_acquire("sim", [0], Holder.for_this_process("mine", "t"))
    assert not isinstance(held, list)
    record = waiter_record(**{field: value})
    holder = {**json.loads(Holder.for_this_process("x").to_json()), field: value}
    content = raw if raw is not None else json.dumps(record).encode()
    (lock / "waiting").mkdir(mode=0o1777)
    plant(lock / "waiting" / "planted.json", kind, content)
    plant(lock / "sim-1.lock", kind, json.dumps(holder).encode())
    plant(lock / "sim-2.share-1-x", kind, content)
    plant(lock / "port-29500.lock", kind, content)
    said: list[str] = []
    room = WaitingRoom(lock, "mine", said.append)
    found = room.others("sim")
    assert all(isinstance(w, Waiter) for w in found)
    assert all(isinstance(w.pid, int) and 1 <= w.pid < 1 << 22 for w in found)
    assert all(isinstance(w.since, float) and w.since <= time.time() for w in found)
    if kind != "json" or raw is not None:
        assert not found
        assert [line for line in said if "planted.json" in line] or kind == "json"
    assert len(said) <= 1 and all("\n" not in line for line in said)
    assert [w for w in device_views.waiters(lock) if w.platform == "sim"] == found
    states = locks.status()  # what `devpool locks`, doctor and the host page read
    for state in states:
        if state.holder is not None:
            assert isinstance(state.holder.pid, int) and isinstance(state.holder.since, float)
            state.holder.describe()
    locks.held_by_others("nobody")
    fair_limit(4, None, found)
    held.release()


def test_a_waiter_with_wrong_types_or_ranges_is_skipped_with_one_line(tmp_path: Path) -> None:
    room = tmp_path / "waiting"
    room.mkdir(mode=0o1777)
    cases = {
        "pid-text": {"pid": "abc"},
        "pid-huge": {"pid": 10**30},
        "since-text": {"since": "zz"},
        "since-future": {"since": time.time() + 10**6},
        "wants-huge": {"wants": 10**12},
        "wants-zero": {"wants": 0},
    }
    for name, fields in cases.items():
        (room / f"{name}.json").write_text(json.dumps(waiter_record(**fields)))
    said: list[tuple[str, str]] = []
    assert read_waiters(room, lambda name, line: said.append((name, line))) == []
    assert sorted(name for name, _ in said) == sorted(f"{name}.json" for name in cases)
    assert all(name in line for name, line in said)


def test_a_planted_waiter_expires_by_age_and_claims_no_more_than_the_pool(
    tmp_path: Path,
) -> None:
    room = tmp_path / "waiting"
    room.mkdir(mode=0o1777)
    far = room / "far.json"
    far.write_text(json.dumps(waiter_record(host="elsewhere", since=1.0, wants=1000000)))
    found = read_waiters(room, lambda name, line: None)
    assert [w.session for w in found] == ["other"]
    # The claim is capped by the pool: a huge one takes no more than all of it.
    assert fair_limit(8, None, found) == 0
    old = time.time() - 3600
    os.utime(far, (old, old))  # nobody rewrote it for an hour: it has expired
    assert read_waiters(room, lambda name, line: None) == []
    assert fair_limit(8, None, []) is None
    # Pid 1 on this host, in a file its owner does not run: not a waiter of that process.
    init = room / "init.json"
    init.write_text(json.dumps(waiter_record(pid=1)))
    if os.geteuid() != 0 and os.stat("/proc/1").st_uid != os.geteuid():
        assert read_waiters(room, lambda name, line: None) == []


def test_a_waiting_folder_that_is_a_file_or_closed_is_said_once_and_not_used(
    tmp_path: Path,
) -> None:
    (tmp_path / "waiting").write_text("not a folder")
    said: list[str] = []
    room = WaitingRoom(tmp_path, "mine", said.append)
    room.wait(waiter_record_waiter())
    assert room.others("sim") == [] and room.others("sim") == []
    assert len(said) == 1 and "is not a folder" in said[0], said
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    assert "symlink" in str(folder_problem(link))


def waiter_record_waiter() -> Waiter:
    return Waiter("mine", os.getpid(), socket.gethostname(), "sim", time.time(), 1)
