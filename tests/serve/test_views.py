"""The host page's data and HTML without a browser: lock states, waiting runs, run records,
history, quarantine, escaping, run files and the loopback rule."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from serving import need

from devpool.cli import main
from devpool.devices.leases import Holder
from devpool.devices.lockdir import LockDir
from devpool.history.durations import History, TestResult
from devpool.report.record import RecordWriter
from devpool.serve import device_views, pages, views
from devpool.serve.hosts import is_loopback

HOSTILE = "<img src=x onerror=alert(1)>"


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.text += data


def _parsed(html: str) -> _Tags:
    tags = _Tags()
    tags.feed(html)
    return tags


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _record(folder: Path, run_id: str, *, pid: int, end: int | None, failed: str = "") -> Path:
    path = folder / "runs" / run_id / "record.jsonl"
    writer = RecordWriter(path)
    host = os.uname().nodename
    writer.write("session_start", run_id=run_id, host=host, pid=pid, platform="sim",
                 devices=[0, 1], tests=2)  # fmt: skip
    writer.write("job_start", job=1, nodeid="t.py::test_ok", devices=[0], attempt=1, log="")
    writer.write("job_end", job=1, nodeid="t.py::test_ok", outcome="passed", devices=[0])
    if failed:
        writer.write("job_start", job=2, nodeid=failed, devices=[1], attempt=1, log="")
        writer.write("job_end", job=2, nodeid=failed, outcome="failed", devices=[1],
                     detail=HOSTILE, tail=["E   " + HOSTILE])  # fmt: skip
    if end is not None:
        writer.write("session_end", exitstatus=end)
    writer.close()
    (path.parent / "logs").mkdir()
    (path.parent / "logs" / "worker-1.log").write_text(HOSTILE)
    return path


def test_holders_user_names_and_failures_are_escaped_text(tmp_path: Path) -> None:
    locks = LockDir(tmp_path / "locks")
    holder = Holder(os.getpid(), os.uname().nodename, "run-1", f"t.py::test[{HOSTILE}]",
                    time.time(), HOSTILE)  # fmt: skip
    lease = locks.try_acquire("sim", [0, 1], holder)
    assert not isinstance(lease, list)
    try:
        states = device_views.lock_states(locks.path)
        devices = device_views.devices_view(states, locks.path, known=[("sim", 2)])
    finally:
        lease.release()
    assert [(d["name"], d["state"]) for d in devices["devices"]] == [
        ("sim:0", "held"),
        ("sim:1", "held"),
        ("sim:2", "free"),
    ]
    assert devices["devices"][0]["holders"][0]["test"] == f"t.py::test[{HOSTILE}]"
    html = pages.devices_section(devices, {}, time.time())
    parsed = _parsed(html)
    assert "img" not in parsed.tags
    assert f"t.py::test[{HOSTILE}]" in parsed.text and f"user {HOSTILE}" in parsed.text

    folder = tmp_path / ".devpool"
    record = _record(folder, "r1", pid=_dead_pid(), end=1, failed=f"t.py::test_bad[{HOSTILE}]")
    run = views.RunIndex(views.projects_of([folder])).summaries()[0].to_json()
    page = _parsed(pages.run_page(run) + pages.recent_section({"runs": [run]}))
    assert "img" not in page.tags
    assert f"t.py::test_bad[{HOSTILE}]" in page.text and "E   " + HOSTILE in page.text
    assert run["failures"][0]["detail"] == HOSTILE
    assert record.exists()


def test_a_symlinked_lock_file_is_not_followed(tmp_path: Path) -> None:
    locks = LockDir(tmp_path / "locks")
    target = tmp_path / "elsewhere"
    target.write_text(Holder(1, "h", "evil", "x", 0.0, "u").to_json())
    (locks.path / "sim-5.lock").symlink_to(target)
    holder = Holder.for_this_process("run-1", "t.py::test_a")
    lease = locks.try_acquire("sim", [0], holder)
    assert not isinstance(lease, list)
    try:
        states = device_views.lock_states(locks.path)
        names = [d["name"] for d in device_views.devices_view(states, locks.path)["devices"]]
    finally:
        lease.release()
    assert names == ["sim:0"]


def test_runs_say_how_they_ended(tmp_path: Path) -> None:
    folder = tmp_path / ".devpool"
    _record(folder, "20260101-000001-1", pid=_dead_pid(), end=0)
    _record(folder, "20260101-000002-2", pid=_dead_pid(), end=2)
    _record(folder, "20260101-000003-3", pid=_dead_pid(), end=None)
    _record(folder, "20260101-000004-4", pid=os.getpid(), end=None, failed="t.py::test_bad")
    # A live pid that began after the run did is a reused pid: the run's controller died.
    reused = folder / "runs" / "20260101-000005-5" / "record.jsonl"
    reused.parent.mkdir()
    start = {"v": 1, "type": "session_start", "time": time.time() - 3600, "pid": os.getpid()}
    start.update(host=os.uname().nodename, platform="sim", devices=[0], tests=1)
    reused.write_text(json.dumps(start) + "\n")
    index = views.RunIndex(views.projects_of([folder]))
    summaries = index.summaries()
    live = views.runs_view(summaries, live=True)["runs"]
    recent = views.runs_view(summaries, live=False)["runs"]
    assert [r["run"] for r in live] == ["20260101-000004-4"]
    assert live[0]["done"] == 2 and live[0]["failures"][0]["test"] == "t.py::test_bad"
    endings = {r["run"]: r["ending"] for r in recent}
    assert endings == {
        "20260101-000001-1": "passed (exit 0)",
        "20260101-000002-2": "interrupted (exit 2)",
        "20260101-000003-3": "interrupted: the run was killed before it finished (no session_end)",
        "20260101-000005-5": "interrupted: the run was killed before it finished (no session_end)",
    }
    assert all(
        r["logs"] == [f"/runs/{r['project']}/{r['run']}/files/logs/worker-1.log"]
        for r in recent
        if r["run"] != "20260101-000005-5"
    )
    again = [s for s in index.summaries() if not s.live]
    assert all(a is b for a, b in zip(again, [s for s in summaries if not s.live], strict=True))


def test_waiting_runs_are_read_without_removing_dead_ones(tmp_path: Path) -> None:
    locks = LockDir(tmp_path / "locks")
    waiting = locks.path / "waiting"
    waiting.mkdir()
    host = os.uname().nodename
    alive = {"session": "run-w", "pid": os.getpid(), "host": host, "platform": "sim",
             "since": time.time() - 3, "wants": 2}  # fmt: skip
    dead = {**alive, "session": "run-dead", "pid": _dead_pid()}
    (waiting / "run-w.json").write_text(json.dumps(alive))
    (waiting / "run-dead.json").write_text(json.dumps(dead))
    lease = locks.try_acquire("sim", [0, 1, 2, 3], Holder.for_this_process("run-h", "t::big"))
    assert not isinstance(lease, list)
    try:
        states = device_views.lock_states(locks.path)
        view = device_views.waiting_view(device_views.waiters(locks.path), states)
    finally:
        lease.release()
    assert [(w["run"], w["wants"], w["pool"], w["fair_share"]) for w in view["waiting"]] == [
        ("run-w", 2, 4, None)
    ]
    assert view["waiting"][0]["busy"] == ["sim:0", "sim:1", "sim:2", "sim:3"]
    assert (waiting / "run-dead.json").exists()  # read only


def test_run_files_only_from_inside_the_run_folder(tmp_path: Path) -> None:
    need("starlette", "pip install -e '.[serve]' (pinned in [dev] too)")
    from devpool.serve.app import safe_file

    run = tmp_path / "runs" / "r1"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "worker-1.log").write_text("log")
    (tmp_path / "secret").write_text("secret")
    (run / "logs" / "link.log").symlink_to(tmp_path / "secret")
    (run / "dirlink").symlink_to(tmp_path)
    assert safe_file(run, "logs/worker-1.log") == (run / "logs" / "worker-1.log").resolve()
    for bad in ("../../secret", "logs/../../../secret", "/etc/passwd", "logs/link.log",
                "dirlink/secret", "logs", "", "logs/missing.log", "a\0b"):  # fmt: skip
        assert safe_file(run, bad) is None, bad


def test_flakiest_capacity_and_quarantine_from_the_project(tmp_path: Path) -> None:
    folder = tmp_path / ".devpool"
    folder.mkdir()
    results = []
    for run in range(6):
        flip = "failed" if run % 2 else "passed"
        results += [
            TestResult("t.py::test_flip", flip, 1.0, "sim", 2, "sim-4", 1000.0 + run, f"r{run}"),
            TestResult(
                "t.py::test_steady", "passed", 2.0, "sim", 4, "sim-4", 1000.0 + run, f"r{run}"
            ),
        ]
    results.append(TestResult("t.py::test_rerun", "flaky", 1.0, "sim", 1, "sim-4", 1100.0, "r9"))
    with History(folder / "history.sqlite") as history:
        history.add(results)
    (tmp_path / "pyproject.toml").write_text(
        '[tool.devpool.quarantine."t.py::test_flip"]\nreason = "flips"\nowner = "me"\n'
        'until = "2020-01-01"\n'
    )
    view = views.tests_view(views.projects_of([folder]))
    project = view["projects"][0]
    assert project["problem"] is None
    assert [row["test"] for row in project["flaky"]] == ["t.py::test_rerun", "t.py::test_flip"]
    assert project["flaky"][1]["flips"] == 5
    sizes = {row["devices"]: (row["tests"], row["device_seconds"]) for row in project["capacity"]}
    assert sizes == {"1": (1, 1.0), "2": (1, 2.0), "4": (1, 8.0)}
    assert project["quarantine"][0]["expired"] is True
    html = pages.tests_section(view)
    # Test ids may wrap after their separators (<wbr>), never mid-word.
    assert "expired" in html and "t.py::test_flip" in html.replace("<wbr>", "")


def test_beyond_loopback_without_a_token_is_one_sentence_and_exit_4(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DEVPOOL_SERVE_TOKEN", raising=False)
    assert main(["serve", "--host", "0.0.0.0", "--port", "1"]) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "devpool: error: devpool serve on 0.0.0.0 (beyond loopback) needs --token-file or "
        "DEVPOOL_SERVE_TOKEN"
    ]
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert is_loopback("127.0.0.2") and not is_loopback("10.0.0.1")
    assert not is_loopback("example.com")


def test_a_shared_device_shows_its_free_memory(tmp_path: Path) -> None:
    locks = LockDir(tmp_path / "locks")
    holder = Holder.for_this_process("run-m", "t.py::test_small")
    lease = locks.try_acquire_memory("sim", [0], 8 << 30, {0: 80 << 30}, holder)
    assert not isinstance(lease, list)
    try:
        states = device_views.lock_states(locks.path)
        view = device_views.devices_view(states, locks.path, memory={("sim", 0): 80 << 30})
    finally:
        lease.release()
    device = view["devices"][0]
    assert device["state"] == "shared" and device["holders"][0]["memory"] == 8 << 30
    assert (device["memory_free"], device["memory_total"]) == (72 << 30, 80 << 30)
    html = _parsed(pages.devices_section(view, {}, time.time())).text
    assert "72 GiB free of 80 GiB" in html and "t.py::test_small" in html


def test_an_edit_of_the_quarantine_file_reaches_the_tests_view_and_moves_the_signature(
    tmp_path: Path,
) -> None:
    from devpool.serve.app import Sources

    (tmp_path / "pyproject.toml").write_text('[tool.devpool]\nquarantine-file = "q.toml"\n')
    quarantine = tmp_path / "q.toml"
    quarantine.write_text('["t.py::test_a"]\nreason = "races"\n')
    sources = Sources(tmp_path / "locks", views.projects_of([tmp_path / ".devpool"]))
    assert [e["test"] for e in sources.tests()["projects"][0]["quarantine"]] == ["t.py::test_a"]
    before = sources._signature()
    time.sleep(0.01)  # a new mtime even on coarse clocks: the size changes anyway
    quarantine.write_text(
        '["t.py::test_a"]\nreason = "races"\n\n["t.py::test_b"]\nreason = "leaks"\n'
    )
    shown = [e["test"] for e in sources.tests()["projects"][0]["quarantine"]]
    assert shown == ["t.py::test_a", "t.py::test_b"]
    assert sources._signature() != before
    # Another file named in pyproject: that one is followed from then on.
    (tmp_path / "other.toml").write_text('["t.py::test_c"]\nreason = "r"\n')
    (tmp_path / "pyproject.toml").write_text('[tool.devpool]\nquarantine-file = "other.toml"\n')
    assert [e["test"] for e in sources.tests()["projects"][0]["quarantine"]] == ["t.py::test_c"]
    assert tmp_path / "other.toml" in sources.test_files()


def test_a_token_in_argv_is_refused_and_the_cookie_holds_no_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], serve: Any
) -> None:
    assert main(["serve", "--token", "T0KEN"]) == 4
    err = capsys.readouterr().err
    assert "--token is gone" in err and "--token-file" in err and "T0KEN" not in err
    empty = tmp_path / "empty"
    empty.write_text("\n")
    assert main(["serve", f"--token-file={empty}"]) == 4
    assert "is empty" in capsys.readouterr().err
    server = serve(token="T0KEN")
    assert server.get("/api/v1/devices")[0] == 401
    with urllib.request.urlopen(server.url + "/api/v1/devices?token=T0KEN", timeout=10) as got:
        cookie = got.headers["set-cookie"]
    assert "T0KEN" not in cookie and "httponly" in cookie.lower()
    assert "samesite=strict" in cookie.lower() and "secure" not in cookie.lower()
    value = cookie.split(";")[0]
    assert server.get("/api/v1/devices", {"Cookie": value})[0] == 200  # the cookie will do
    raw = {"Cookie": "devpool_serve_token=T0KEN"}
    assert server.get("/api/v1/devices", raw)[0] == 401  # the token itself is no cookie


def test_one_damaged_run_record_leaves_the_others_on_the_page(tmp_path: Path) -> None:
    folder = tmp_path / ".devpool"
    _record(folder, "good", pid=_dead_pid(), end=0)
    bad = folder / "runs" / "bad" / "record.jsonl"
    bad.parent.mkdir(parents=True)
    bad.write_text(
        '{"v": 1, "type": "session_start", "time": "zz", "run_id": 5, "devices": 3}\n'
        '{"v": 1, "type": "job_end", "job": "x", "outcome": [], "time": null}\n'
    )
    found = views.RunIndex(views.projects_of([folder])).summaries()
    assert [summary.run_id for summary in found] == ["good"]
