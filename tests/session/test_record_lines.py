"""session/record_lines: the run record's session_start and session_end lines, written
through a real RecordWriter and read back by the reader every report uses."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from devpool.config import Settings
from devpool.history.location import HistoryUrl
from devpool.plan.jobs import Job, Plan
from devpool.plan.markers import Request
from devpool.report.record import LiveRecord, RecordWriter, read_record
from devpool.session import record_lines

URL = "postgresql://ci:hunter2@db.example:5432/queue"


class Controller:
    """What record_lines needs of the controller (its Recording protocol)."""

    def __init__(self, run_dir: Path, settings: Settings) -> None:
        self.settings = settings
        self.inventory: Any = SimpleNamespace(
            platform=SimpleNamespace(name="sim", kind="simkind"), devices=(0, 1), source="flag"
        )
        self.run_id = run_dir.name
        self.host = "here"
        self.run_dir = run_dir
        self.log_dir = run_dir / "logs"
        self.memory = {0: 1024, 1: 2048}
        self.record_path = run_dir / "record.jsonl"
        self.record: RecordWriter | None = None
        self.live_record = LiveRecord(self.record_path)

    def emit(self, event_type: str, **fields: Any) -> None:
        assert self.record is not None
        self.record.write(event_type, **fields)
        self.live_record.event(event_type, fields)


def _config(tmp_path: Path, deselected: int) -> Any:
    terminal = SimpleNamespace(stats={"deselected": [object()] * deselected})
    return SimpleNamespace(
        invocation_params=SimpleNamespace(args=("-x", f"--devpool-queue={URL}"), dir=tmp_path),
        pluginmanager=SimpleNamespace(get_plugin=lambda name: terminal),
    )


def _job(id: int, display: str = "") -> Job:
    return Job(id, f"t.py::test_{id}", ("t.py", id, f"test_{id}"), Request(), id, display=display)


def _ended(job: int, outcome: str) -> dict[str, Any]:
    return {"job": job, "nodeid": f"t.py::test_{job}", "devices": [], "host": "here",
            "start": 1.0, "end": 2.0, "run_time": 1.0, "attempt": 1, "outcome": outcome,
            "tail": [], "log": "", "detail": ""}  # fmt: skip


def test_session_start_says_who_runs_what_where_without_a_password(tmp_path: Path) -> None:
    history = HistoryUrl(URL.replace("/queue", "/history"))
    settings = Settings(
        devices="0,1", platforms={}, cpu_slots=2, queue=URL, history=history, run_dir=tmp_path
    )
    ctx = Controller(tmp_path / "20260101-000000-1", settings)
    ctx.run_dir.mkdir()
    plan = Plan(jobs=[_job(1), _job(2, display="t.py::test_2[1-2]")])
    plan.unsatisfiable.append((_job(3), "needs 8 devices"))
    record_lines.start(ctx, _config(tmp_path, deselected=4), plan)
    assert ctx.record is not None
    ctx.record.close()
    text = ctx.record_path.read_text(encoding="utf-8")
    assert "hunter2" not in text
    (line,) = [json.loads(line) for line in text.splitlines()]
    assert line["type"] == "session_start"
    assert (line["run_id"], line["host"], line["platform"], line["kind"]) == (
        "20260101-000000-1",
        "here",
        "sim",
        "simkind",
    )
    assert line["tests"] == 3 and line["deselected"] == 4
    assert line["planned"] == ["t.py::test_1", "t.py::test_2[1-2]", "t.py::test_3"]
    assert line["options"]["queue"] == URL.replace("hunter2", "***")
    assert line["options"]["history"] == str(history) and "***" in str(history)
    assert line["options"]["cpu_slots"] == 2
    assert "platforms" not in line["options"] and "devices" not in line["options"]
    assert line["args"][0] == "-x" and "***" in line["args"][1]
    assert line["memory"] == {"0": 1024, "1": 2048} and line["devices"] == [0, 1]
    assert "ray_address" not in line  # a local run joins no Ray cluster


def test_session_end_counts_the_troubles_by_outcome(tmp_path: Path) -> None:
    settings = Settings(devices="0,1", platforms={}, cpu_slots=2, run_dir=tmp_path)
    ctx = Controller(tmp_path / "20260101-000000-2", settings)
    ctx.run_dir.mkdir()
    record_lines.start(ctx, _config(tmp_path, deselected=0), Plan(jobs=[_job(i) for i in range(5)]))
    outcomes = ["passed", "failed", "timeout", "failed", "skipped"]
    for job, outcome in enumerate(outcomes):
        ctx.emit("job_end", **_ended(job, outcome))
    record_lines.end(ctx, 1)
    record = read_record(ctx.record_path)
    assert record.finished
    last = json.loads(ctx.record_path.read_text(encoding="utf-8").splitlines()[-1])
    assert last["type"] == "session_end" and last["exitstatus"] == 1
    assert last["troubles"] == {"failed": 2, "timeout": 1}
    assert last["controller_cpu"] >= 0
    assert record_lines.troubles(record) == last["troubles"]  # the reader agrees
