"""The run record: JSON lines with a versioned schema, written as things happen.

Each line is one event. A controller killed at any moment leaves every line it had
written (job starts, the moves of attempts and phase reports wait up to 0.2 s in memory,
every other line is flushed at once, see BUFFERED); a record without a `session_end` line is
a run that was cut. The reader takes a damaged file up to the damage and says, in one
sentence, where and what was lost.

Events (every line has "v": SCHEMA_VERSION, "type", "time" as Unix seconds):
  session_start  run_id, host, pid, args, cwd, platform, kind, devices, options, tests,
                 planned (the node ids of every planned test), deselected (how
                 many tests the closing line counts deselected), ray_address (with
                 --devpool-backend ray: the cluster it joins)
  lease          job, nodeid, devices, holder_pid, wait (seconds blocked on other runs)
  job_start      job, nodeid, devices, host, worker (key), worker_pid (null for a fork not
                 made yet: its worker_ready has it), queue_wait, attempt, log
  attempt        job, nodeid, attempt, state (a move of the attempt: sent, started, queued
                 with its reason, timed-out, crashed, lost, concluded ...), devices; the
                 ordinary ending's reported → concluded is not written: its job_end says it
  report         nodeid, when, outcome, duration: the call phase, and a phase that did not
                 pass (a passed setup or teardown says nothing job_end does not)
  job_end        job, nodeid, outcome, devices, host, start, end, run_time, queue_wait,
                 attempt, log, detail, tail (last lines of the log, for tests that did not pass),
                 ports, resources (when its worker held leased ports or named resources)
  host_lease     job, nodeid, ports, resources (taken with the devices, issue 22)
                 category (pytest's own category where it is not the outcome: xfailed, xpassed)
                 counted (pytest's closing-line category of each report of the attempt that
                 pytest was told, in order: ["passed", "error"], ["rerun"], [] when none)
  shard          (--devpool-shard runs, right after session_start) shard "K/N", k, n,
                 fingerprint, costs, split (node ids of every shard), deselected (this
                 shard's tests deselected after the split), history, pending
  leak           (issue 52, right before the job_end of the attempt it is charged to) job,
                 nodeid, attempt, kind (process, thread, memory), pid, command, user, holds
                 (what it could still see or hold: "sim:0", "port 30001", "sim:0 3.0 GiB"),
                 fixture (the module or session fixture that owned it, else null), ended
                 (terminated, killed, exited, not permitted, retired, "" when only reported),
                 devices (the test's), mode (warn, fail)
  session_end    exitstatus, troubles (outcome → tests that did not pass), controller_cpu
                 (the controller process's CPU seconds, its own: not its workers')

A new event type or field is added under the same version (readers skip types they do
not know and read fields with defaults); the version changes only when a reader of the
old version would misread a line.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from devpool.errors import DevpoolError

SCHEMA_VERSION = 1
INTERRUPTED = 2  # pytest.ExitCode.INTERRUPTED
_GATING_NAMES = frozenset({"failed", "error", "timeout", "crashed", "infra"})


# Lines that may wait in memory a moment: a test's start, the moves of its attempt and its
# phase reports come several a test, and a line each flushed on its own costs the
# controller CPU that its workers need. Every other line (job_end, lease, session_*)
# flushes at once, with whatever waited before it, in order: a SIGKILLed controller keeps
# every job_end it wrote (and every line before it), and loses at most the starts, moves
# and reports of the last BUFFER_SECONDS.
BUFFERED = frozenset({"job_start", "attempt", "report"})
BUFFER_SECONDS = 0.2
# One encoder for every line: json.dumps with options builds a new one per call.
_encode = json.JSONEncoder(default=str, ensure_ascii=False).encode


class RecordWriter:
    """Appends events to the record; every line but the BUFFERED kinds is flushed at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        # backslashreplace: a lone surrogate (say, a non-UTF-8 argv entry) must not kill the run.
        self._file: IO[str] | None = open(  # noqa: SIM115 - open for the whole run
            path, "a", encoding="utf-8", errors="backslashreplace"
        )
        self._waiting: list[str] = []
        self._flushed_at = time.monotonic()
        # While the dispatch loop runs, a line that flushes at once waits for the end of the
        # loop's turn (flush_due, before it sleeps or after it read its workers' messages):
        # the job_ends of every test one read brought go to disk in one write, not one each.
        self.per_turn = False
        self._urgent = False
        self._reported: set[tuple[Any, Any]] = set()  # (job, attempt) whose move is unwritten

    def _said_elsewhere(self, event_type: str, fields: Mapping[str, Any]) -> bool:
        """Lines a test's job_end says already (issue 45: 5 lines a test, not 9); the live
        listeners still get them (SLOW lines, the progress)."""
        if event_type == "report":
            return fields.get("when") != "call" and fields.get("outcome") == "passed"
        if event_type != "attempt":
            return False
        key = (fields.get("job"), fields.get("attempt"))
        state = fields.get("state")
        if state == "reported":  # the worker's reports ended it: job_end follows at once
            self._reported.add(key)
            return True
        if state == "concluded" and key in self._reported:
            self._reported.discard(key)
            return True
        return False

    def write(self, event_type: str, **fields: Any) -> None:
        if self._file is None or self._said_elsewhere(event_type, fields):
            return
        event = {"v": SCHEMA_VERSION, "type": event_type, "time": round(time.time(), 3), **fields}
        self._waiting.append(_encode(event) + "\n")
        if event_type not in BUFFERED:
            if not self.per_turn:
                self.flush()
                return
            self._urgent = True
        if time.monotonic() - self._flushed_at >= BUFFER_SECONDS:
            self.flush()

    def flush_due(self) -> None:
        """Flush the lines that must not wait (per_turn), or have waited BUFFER_SECONDS."""
        waited = time.monotonic() - self._flushed_at >= BUFFER_SECONDS
        if self._urgent or (self._waiting and waited):
            self.flush()

    def flush(self) -> None:
        """Write and flush the lines that wait."""
        if self._file is None or not self._waiting:
            return
        self._file.write("".join(self._waiting))
        self._waiting.clear()
        self._urgent = False
        self._file.flush()
        self._flushed_at = time.monotonic()

    def close(self) -> None:
        if self._file is not None:
            self.flush()
            self._file.close()
            self._file = None


@dataclass
class JobRun:
    """One attempt of one job, as the record tells it."""

    job: int
    nodeid: str
    devices: list[int]
    attempt: int = 1
    start: float | None = None  # devices held from (the lease, or the job's start)
    end: float | None = None
    test_time: float = 0.0  # the test's own run time, without worker start-up
    queue_wait: float = 0.0
    outcome: str | None = None  # None while running (or when the run was cut)
    gating: bool = False  # whether this ending fails the run
    detail: str = ""
    log: str = ""
    host: str = ""
    tail: list[str] = field(default_factory=list)
    test: str = ""  # the test's own node id (nodeid is a --devpool-repeat display id)
    retried: bool = False  # this attempt was run again: not the test's final word
    ports: list[int] = field(default_factory=list)  # leased TCP ports its worker held
    resources: dict[str, int] = field(default_factory=dict)  # named host resources held
    category: str = ""  # pytest's category where it differs: "xfailed" (skipped), "xpassed"
    counted: list[str] | None = None  # pytest's category per report it counted (None: older)
    artifacts: str = ""  # its devpool_artifacts folder, kept because it did not pass
    quarantined: str = ""  # its quarantine entry, when one excused it
    worker_pid: int | None = None  # the worker that ran it (None: it never reached one)

    @property
    def shown(self) -> str | None:
        """The category pytest's closing line counts this attempt in (None while running)."""
        return self.category or self.outcome

    @property
    def test_id(self) -> str:
        """The collected test this attempt belongs to (repeats share one)."""
        return self.test or self.nodeid

    @property
    def run_time(self) -> float:
        if self.start is None or self.end is None:
            return 0.0
        return self.end - self.start


@dataclass(frozen=True)
class LeakLine:
    """What one attempt (or a wider fixture it set up) left behind: a `leak` line."""

    job: int  # -1: no job of this run's (found at the run's end)
    nodeid: str  # the test charged (display id)
    kind: str  # process, thread, memory
    pid: int | None  # the process; a thread's or memory's: the worker
    command: str = ""  # its command line; a thread's name and target; memory: ""
    holds: tuple[str, ...] = ()  # devices it sees ("sim:0"), leased ports ("port 30001")
    ended: str = ""  # terminated, killed, exited, not permitted, retired; "": only reported
    attempt: int = 1
    user: str = ""
    fixture: str | None = None  # "server (module)": the fixture that owned it
    devices: tuple[int, ...] = ()  # the test's devices
    mode: str = ""  # --devpool-leaks in force: warn, fail
    time: float = 0.0

    @classmethod
    def of(cls, event: Mapping[str, Any]) -> LeakLine:
        pid = event.get("pid")
        fixture = event.get("fixture")
        return cls(
            job=int(event.get("job") or 0) if event.get("job") is not None else -1,
            nodeid=str(event["nodeid"]),
            kind=str(event.get("kind") or "process"),
            pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
            command=str(event.get("command") or ""),
            holds=tuple(str(h) for h in event.get("holds") or ()),
            ended=str(event.get("ended") or ""),
            attempt=int(event.get("attempt", 1)),
            user=str(event.get("user") or ""),
            fixture=str(fixture) if fixture else None,
            devices=tuple(int(d) for d in event.get("devices") or ()),
            mode=str(event.get("mode") or ""),
            time=float(event.get("time", 0.0)),
        )

    @property
    def loud(self) -> bool:
        """devpool may not end it (another user's): its devices were not handed over."""
        return self.ended == "not permitted"

    def what(self) -> str:
        """'pid 4242 `python -m http.server 30001` (sees sim:0; port 30001): terminated'."""
        pid = "?" if self.pid is None else str(self.pid)
        if self.kind == "thread":
            text = f"thread `{self.command}` in worker pid {pid}"
        elif self.kind == "memory":
            text = f"device memory in worker pid {pid}"
        else:
            text = f"pid {pid} `{self.command}`"
        if self.holds:
            verb = "holds" if self.kind == "memory" else "sees"
            text += f" ({verb} {'; '.join(self.holds)})"
        if self.fixture:
            text += f", set up by fixture {self.fixture}"
        if self.loud and self.user:
            text += f", user {self.user}"
        return f"{text}: {self.ended or 'reported'}"

    def line(self) -> str:
        """'tests/test_srv.py::test_server: pid 4242 `…` (sees sim:0; port 30001): terminated'."""
        return f"{self.nodeid}: {self.what()}"

    def device_ids(self, platform: str) -> list[int]:
        """The devices it touched: the test's, and those of `platform` its holds name."""
        found = list(self.devices)
        for held in self.holds:
            name, _, rest = held.partition(":")
            numbers = rest.split(" ", 1)[0].split(",") if name == platform else []
            found += [int(n) for n in numbers if n.isdigit() and int(n) not in found]
        return found


@dataclass
class RunRecord:
    """Everything a record says about one run, including how much of it survived."""

    path: Path
    start: Mapping[str, Any] = field(default_factory=dict)
    end: Mapping[str, Any] | None = None
    jobs: list[JobRun] = field(default_factory=list)
    shard: Mapping[str, Any] | None = None  # the shard event of a --devpool-shard run
    damage: str | None = None  # one sentence when the file was cut or corrupt
    last_time: float = 0.0
    leaks: list[LeakLine] = field(default_factory=list)  # its `leak` lines, in order

    @property
    def finished(self) -> bool:
        return self.end is not None

    @property
    def platform(self) -> str:
        return str(self.start.get("platform", "?"))

    @property
    def devices(self) -> list[int]:
        return [int(d) for d in self.start.get("devices", [])]

    @property
    def options(self) -> Mapping[str, Any]:
        """The run's settings as session_start recorded them ({} when absent)."""
        options = self.start.get("options")
        return options if isinstance(options, Mapping) else {}

    @property
    def leaks_checked(self) -> bool:
        """Whether the run looked for leaks (--devpool-leaks warn or fail; an older record
        did not)."""
        return self.options.get("leaks") in ("warn", "fail") or bool(self.leaks)

    @property
    def total_tests(self) -> int:
        return int(self.start.get("tests", 0))

    def finished_jobs(self) -> list[JobRun]:
        return [job for job in self.jobs if job.outcome is not None]

    def final_attempts(self) -> list[JobRun]:
        """The last finished attempt of each test: what the run's verdict rests on."""
        last: dict[str, JobRun] = {}
        for job in self.finished_jobs():
            last[job.nodeid] = job
        return list(last.values())

    @property
    def interrupted(self) -> bool:
        """The run ended early at a signal or Ctrl-C (pytest's exit status 2)."""
        return self.end is not None and self.end.get("exitstatus") == INTERRUPTED

    def duration(self) -> float:
        begin = float(self.start.get("time", 0.0))
        if self.end is not None:
            return float(self.end.get("time", begin)) - begin
        return max(0.0, self.last_time - begin)

    def cut_sentence(self) -> str | None:
        """'killed after 42 m: 812 of 1,100 tests ran' for a run that never ended, else None."""
        if self.finished:
            return None
        ran = len(self.final_attempts())
        minutes = self.duration() / 60
        took = f"{minutes:.0f} m" if minutes >= 1 else f"{self.duration():.0f} s"
        return (
            f"the run did not finish (killed or still running after {took}): "
            f"{ran:,} of {self.total_tests:,} tests ran"
        )


def read_run(path: Path) -> RunRecord:
    """A run given as its record.jsonl or as its run folder (every command that reads a run)."""
    record = path / "record.jsonl" if path.is_dir() else path
    if path.is_dir() and not record.is_file():
        raise DevpoolError(f"{path} is a folder without a record.jsonl: no devpool run folder")
    return read_record(record)


def read_record(path: Path) -> RunRecord:
    """Read a record up to any damage; DevpoolError only when nothing at all can be read."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DevpoolError(f"cannot read run record {path}: {exc.strerror or exc}") from None
    record = RunRecord(path)
    open_jobs: dict[int, JobRun] = {}
    lines = raw.split(b"\n")
    complete = raw.endswith(b"\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        cut = number == len(lines) and not complete
        event = _parse(line)
        problem = _problem(event, cut)
        if problem is not None:
            if number == 1 or not record.start:
                raise DevpoolError(f"{path} is not a devpool run record: line {number} {problem}")
            record.damage = (
                f"{path}: line {number} {problem}; showing the {number - 1} lines before it"
                f" ({len([x for x in lines[number:] if x.strip()])} later lines not read)"
            )
            break
        assert event is not None
        try:
            apply_event(record, open_jobs, event)
        except (KeyError, ValueError, TypeError) as exc:
            record.damage = (
                f"{path}: line {number} is a {event['type']} event with a missing or bad field"
                f" ({exc!r}); showing the {number - 1} lines before it"
            )
            break
    if not record.start:
        if not raw.strip():
            raise DevpoolError(f"{path} is empty")
        raise DevpoolError(f"{path} has no session_start line, so it is no whole run record")
    return record


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        event = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return event if isinstance(event, dict) else None


def _problem(event: dict[str, Any] | None, cut: bool) -> str | None:
    if event is None:
        return "is cut off mid-line (the writer was killed)" if cut else "is not JSON"
    version = event.get("v")
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        return (
            f"has schema version {version}, newer than the version {SCHEMA_VERSION} this "
            "devpool reads (upgrade devpool to read it)"
        )
    if version != SCHEMA_VERSION:
        return f"is not a devpool record event (schema version {version!r})"
    if not isinstance(event.get("type"), str):
        return "has no event type"
    return None


class LiveRecord:
    """The record as the run writes it, read as it goes by the same code that reads a file:
    the terminal's summary and `devpool report` rest on one reading (report.summary)."""

    def __init__(self, path: Path) -> None:
        self.record = RunRecord(path)
        self._open: dict[int, JobRun] = {}

    def event(self, event_type: str, fields: Mapping[str, Any]) -> None:
        event = {"time": round(time.time(), 3), **fields, "type": event_type}
        apply_event(self.record, self._open, event)


def apply_event(record: RunRecord, open_jobs: dict[int, JobRun], event: Mapping[str, Any]) -> None:
    """One event into the record being read (a file's line, or a live event)."""
    kind = event["type"]
    record.last_time = max(record.last_time, float(event.get("time", 0.0)))
    if kind == "session_start":
        record.start = event
    elif kind == "session_end":
        record.end = event
    elif kind == "shard":
        record.shard = event
    elif kind == "leak":
        record.leaks.append(LeakLine.of(event))
    elif kind == "job_start":
        run = JobRun(
            job=int(event["job"]),
            nodeid=str(event["nodeid"]),
            devices=[int(d) for d in event.get("devices", [])],
            attempt=int(event.get("attempt", 1)),
            start=float(event["time"]),
            queue_wait=float(event.get("queue_wait", 0.0)),
            log=str(event.get("log", "")),
            host=str(event.get("host", "")),
        )
        open_jobs[run.job] = run
        record.jobs.append(run)
    elif kind == "job_end":
        started = open_jobs.pop(int(event["job"]), None)
        run = started if started is not None else _unstarted(event)
        if started is None:
            record.jobs.append(run)
        run.end = float(event.get("end", event["time"]))
        if run.start is None:
            run.start = float(event.get("start", run.end))
        run.test_time = float(event.get("run_time", run.end - run.start))
        run.outcome = str(event["outcome"])
        run.gating = bool(event.get("gating", run.outcome in _GATING_NAMES))
        run.detail = str(event.get("detail", ""))
        run.log = str(event.get("log", run.log))
        run.tail = [str(line) for line in event.get("tail", [])]
        run.devices = [int(d) for d in event.get("devices", run.devices)]
        run.test = str(event.get("test") or run.nodeid)
        run.retried = bool(event.get("retried", False))
        run.ports = [int(p) for p in event.get("ports", [])]
        run.resources = {str(k): int(v) for k, v in dict(event.get("resources", {})).items()}
        run.category = str(event.get("category") or "")
        counted = event.get("counted")
        run.counted = [str(c) for c in counted] if isinstance(counted, list) else None
        run.artifacts = str(event.get("artifacts") or "")
        run.quarantined = str(event.get("quarantined") or "")
        pid = event.get("worker_pid")
        run.worker_pid = int(pid) if isinstance(pid, int) else None


def _unstarted(event: Mapping[str, Any]) -> JobRun:
    """A job that ended without starting (infra before any lease, skipped as unsatisfiable)."""
    return JobRun(
        job=int(event["job"]),
        nodeid=str(event["nodeid"]),
        devices=[int(d) for d in event.get("devices", [])],
        attempt=int(event.get("attempt", 1)),
        queue_wait=float(event.get("queue_wait", 0.0)),
    )


def latest_record(root: Path) -> Path | None:
    """The newest record under a .devpool/runs folder, for `devpool report` with no argument."""
    runs = root / ".devpool" / "runs"
    candidates: Iterable[Path] = runs.glob("*/record.jsonl") if runs.is_dir() else []
    newest = max(candidates, key=lambda p: p.stat().st_mtime, default=None)
    return newest


def host_name() -> str:
    return os.uname().nodename
