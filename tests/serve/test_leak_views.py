"""End to end over written run records (issue 52, item 4): what tests left behind shows in
`devpool report`, in `devpool report --diff`, and on the host page (each device's last leak,
a run's leaks), each read by the real command from the records as a run writes them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from serving import HOSTILE, Project, Server

from devpool.devices.leases import Holder
from devpool.devices.lockdir import LockDir
from devpool.report.record import RecordWriter

DEVPOOL = (sys.executable, "-m", "devpool.cli")
SERVER = "tests/test_srv.py::test_server"
DAEMON = "tests/test_srv.py::test_daemon"


def write_run(
    folder: Path, run_id: str, tests: list[tuple[str, list[dict[str, Any]]]], at: float
) -> Path:
    """A finished run on sim:0-1 whose tests passed, each leak line (found at `at`) before
    its job_end."""
    path = folder / "runs" / run_id / "record.jsonl"
    writer = RecordWriter(path)
    writer.write("session_start", run_id=run_id, host=os.uname().nodename, pid=1,
                 platform="sim", devices=[0, 1], tests=len(tests), options={"leaks": "warn"},
                 planned=[nodeid for nodeid, _ in tests])  # fmt: skip
    for job, (nodeid, leaks) in enumerate(tests, 1):
        writer.write("job_start", job=job, nodeid=nodeid, devices=[0], attempt=1, log="")
        for fields in leaks:
            writer.write("leak", job=job, nodeid=nodeid, attempt=1, kind="process", user="ci",
                         fixture=None, devices=[0], mode="warn", time=at, **fields)  # fmt: skip
        writer.write("job_end", job=job, nodeid=nodeid, outcome="passed", devices=[0],
                     counted=["passed"])  # fmt: skip
    writer.write("session_end", exitstatus=0)
    writer.close()
    return path.parent


def devpool(*args: str) -> str:
    done = subprocess.run([*DEVPOOL, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_report_diff_and_the_host_page_name_what_tests_left(
    project: Project, serve: Any, tmp_path: Path
) -> None:
    old = write_run(project.devpool, "20260101-000000-1", [
        (SERVER, [{"pid": 4242, "command": f"python -m http.server {HOSTILE}",
                   "holds": ["sim:0", "sim:1", "port 30001"], "ended": "terminated"}]),
        (DAEMON, []),
    ], time.time() - 120)  # fmt: skip
    new = write_run(project.devpool, "20260101-000100-2", [
        (SERVER, []),
        (DAEMON, [{"pid": 5151, "command": "sleep 1000", "holds": ["sim:0"],
                   "ended": "killed"}]),
    ], time.time() - 60)  # fmt: skip
    # devpool report: the leaks of a run; --diff: what changed
    data = json.loads(devpool("report", str(old), "--format", "json"))
    assert data["leaked"] == [SERVER] and data["leaks"][0]["pid"] == 4242
    text = devpool("report", str(new))
    assert f"  {DAEMON}: pid 5151 `sleep 1000` (sees sim:0): killed" in text.splitlines()
    diff = devpool("report", "--diff", str(old), str(new))
    assert f"newly leaking (1):\n  {DAEMON}: leaked pid 5151 `sleep 1000`" in diff
    assert f"no longer leaking (1):\n  {SERVER}: no leak (OLD: pid 4242 " in diff
    # The host page: each device its last leak, from the records it reads
    locks = LockDir(project.lock_dir)
    lease = locks.try_acquire("sim", [0, 1], Holder(os.getpid(), "h", "other", "", 0.0, "me"))
    assert not isinstance(lease, list)
    lease.release()  # the lock files stay: the page lists both devices, free
    server: Server = serve()
    devices = {d["name"]: d for d in server.json("/api/v1/overview")["devices"]["devices"]}
    assert devices["sim:0"]["last_leak"]["test"] == DAEMON
    assert devices["sim:0"]["last_leak"]["run"] == new.name
    assert devices["sim:1"]["last_leak"]["pid"] == 4242  # seen by OLD's server only
    status, page = server.get("/")
    assert status == 200
    body = page.decode().replace("<wbr>", "")
    assert body.count('<div class="leak"') == 2 and DAEMON in body
    assert "<img src=x" not in body and "&lt;img src=x" in body
    status, run_page = server.get(f"/runs/proj/{old.name}")
    assert status == 200
    assert '<h3 id="leaks">Leaks (1)</h3>' in run_page.decode()
