"""What the host page shows, as plain JSON-ready data: live, recent, tests (devices and
waiting: device_views.py).

Everything is read through the readers devpool already has (``read_record``, ``History``,
the quarantine table); nothing here writes, locks for longer than ``status`` does, or
starts a process. Each view is a dict with ``"schema": SCHEMA``.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import socket
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devpool import procfs
from devpool.errors import DevpoolError
from devpool.report.memory_lane import capacities
from devpool.report.record import RunRecord, read_record
from devpool.report.summary import INTERRUPTED, NOT_RUN, summarize
from devpool.serve.device_views import SCHEMA, alive

RECENT_LIMIT = 200  # recent runs kept per page and API answer, newest first
FLAKY_LIMIT = 20
HISTORY_WINDOW = 50  # a test's last results counted for flakiness
_EXIT_WORDS = {
    0: "passed",
    1: "tests failed",
    2: "interrupted",
    3: "internal error",
    4: "usage error",
    5: "no tests collected",
}


@dataclass
class ProjectFolder:
    """One project's ``.devpool/`` folder the page reads; ``key`` names it in URLs."""

    key: str
    folder: Path

    @property
    def runs(self) -> Path:
        return self.folder / "runs"

    @property
    def root(self) -> Path:
        return self.folder.parent


def projects_of(folders: Sequence[Path]) -> list[ProjectFolder]:
    """Projects keyed by their folder's parent name, numbered when two share a name."""
    found: list[ProjectFolder] = []
    seen: Counter[str] = Counter()
    for folder in folders:
        name = folder.resolve().parent.name or "project"
        seen[name] += 1
        key = name if seen[name] == 1 else f"{name}-{seen[name]}"
        found.append(ProjectFolder(key, folder.resolve()))
    return found


# ---- runs ------------------------------------------------------------------------------------


@dataclass
class RunCard:
    """One run record, summed up for the page (cached by the file's size and mtime)."""

    project: str
    run_id: str
    start: float
    duration: float
    live: bool
    counts: dict[str, int]  # pytest's closing-line categories (report.summary)
    done: int  # tests with a final outcome
    total: int
    running: list[dict[str, Any]]
    failures: list[dict[str, Any]]
    exitstatus: int | None
    ending: str
    platform: str
    user: str
    pid: int | None
    devices: list[int] = field(default_factory=list)
    memory: dict[int, int] = field(default_factory=dict)  # bytes each device hands out
    damage: str | None = None
    logs: list[str] = field(default_factory=list)
    ray_address: str | None = None  # the cluster a ray-backed run joined
    host: str = ""  # where it ran (session_start)
    leaks: list[dict[str, Any]] = field(default_factory=list)  # what its tests left behind

    def to_json(self) -> dict[str, Any]:
        done = self.done
        return {
            "project": self.project,
            "run": self.run_id,
            "start": self.start,
            "duration": round(self.duration, 3),
            "live": self.live,
            "platform": self.platform,
            "user": self.user,
            "pid": self.pid,
            "devices": self.devices,
            "counts": self.counts,
            "tests": self.total,
            "done": done,
            "running": len(self.running),
            "queued": max(0, self.total - done - len(self.running)),
            "running_tests": self.running,
            "failures": self.failures,
            "exitstatus": self.exitstatus,
            "ending": self.ending,
            "damage": self.damage,
            "ray_address": self.ray_address,
            "leaks": self.leaks,
            "report": f"/runs/{self.project}/{self.run_id}/report.html",
            "page": f"/runs/{self.project}/{self.run_id}",
            "logs": [f"/runs/{self.project}/{self.run_id}/files/{name}" for name in self.logs],
        }


def summarise(project: str, record: RunRecord, live: bool) -> RunCard:
    """The page's view of one record: progress so far, failures, how it ended."""
    start = record.start
    summary = summarize(record)  # the counts every report form shows (report.summary)
    counts = {
        name: n for name, n in summary.counts() if name not in (INTERRUPTED, NOT_RUN) or not live
    }
    done_ids = {job.nodeid for job in record.final_attempts() if not job.retried}
    running = [
        {
            "test": job.nodeid,
            "devices": job.devices,
            "since": job.start,
            "worker": Path(job.log).stem if job.log else "",  # "worker-3": its Ray actors' name
        }
        for job in record.jobs
        if job.outcome is None and job.nodeid not in done_ids
    ]
    failures = [
        {
            "test": ending.job.nodeid,
            "outcome": ending.job.outcome,
            "detail": ending.job.detail,
            "tail": ending.job.tail[-20:],
            "log": ending.job.log,
        }
        for ending in summary.troubles
    ]
    exitstatus = None
    if record.end is not None:
        raw = record.end.get("exitstatus")
        exitstatus = int(raw) if isinstance(raw, int) else None
    if live:
        ending = "running"
    elif record.end is None:
        ending = "interrupted: the run was killed before it finished (no session_end)"
    elif exitstatus == 2:
        ending = "interrupted (exit 2)"
    else:
        word = _EXIT_WORDS.get(exitstatus or 0, "ended") if exitstatus is not None else "ended"
        ending = f"{word} (exit {exitstatus})"
    pid = start.get("pid")
    user = start.get("user") or _owner(record.path)
    return RunCard(
        project=project,
        run_id=record.path.parent.name,
        start=float(start.get("time", 0.0)),
        duration=record.duration(),
        live=live,
        counts=counts,
        done=summary.ended(),
        total=record.total_tests,
        running=running,
        failures=failures,
        exitstatus=exitstatus,
        ending=ending,
        platform=record.platform,
        user=str(user),
        pid=pid if isinstance(pid, int) else None,
        devices=record.devices,
        memory=capacities(record.start),
        damage=record.damage,
        logs=_logs(record.path.parent),
        ray_address=str(start["ray_address"]) if start.get("ray_address") else None,
        host=str(start.get("host") or ""),
        leaks=[
            {
                "test": leak.nodeid,
                "kind": leak.kind,
                "pid": leak.pid,
                "command": leak.command,
                "holds": list(leak.holds),
                "ended": leak.ended or "reported",
                "what": leak.what(),
                "time": leak.time,
                "devices": leak.device_ids(record.platform),
            }
            for leak in summary.leaks
        ],
    )


def last_leaks(summaries: Iterable[RunCard]) -> dict[tuple[str, int], dict[str, Any]]:
    """Each device's last leak (issue 52) in the runs of this host: what a test left that
    could still see or hold it, with its run; a Ray run's devices are its cluster's."""
    here = (socket.gethostname(), os.uname().nodename)
    found: dict[tuple[str, int], dict[str, Any]] = {}
    for summary in summaries:
        if summary.ray_address is not None or summary.host not in here:
            continue
        for leak in summary.leaks:
            for device in leak["devices"]:
                key = (summary.platform, int(device))
                if key not in found or found[key]["time"] <= leak["time"]:
                    found[key] = {**leak, "run": summary.run_id, "project": summary.project}
    return found


def _owner(path: Path) -> str:
    try:
        import pwd

        return pwd.getpwuid(path.stat().st_uid).pw_name
    except (OSError, KeyError, ImportError):
        return ""


def _logs(run_dir: Path) -> list[str]:
    folder = run_dir / "logs"
    if not folder.is_dir() or folder.is_symlink():
        return []
    names = [
        entry.name
        for entry in os.scandir(folder)
        if entry.is_file(follow_symlinks=False) and entry.name.endswith(".log")
    ]
    # worker-2 before worker-10
    names.sort(key=lambda n: [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", n)])
    return [f"logs/{name}" for name in names]


def _is_live(record: RunRecord) -> bool:
    if record.end is not None:
        return False
    pid = record.start.get("pid")
    host = record.start.get("host")
    if not isinstance(pid, int) or host not in (socket.gethostname(), os.uname().nodename):
        return False
    return alive(pid) and not _started_after(pid, float(record.start.get("time", 0.0)))


def _started_after(pid: int, moment: float) -> bool:
    """True when the process with this pid began after ``moment``: a reused pid, not the
    run's controller (Linux /proc; elsewhere False, so a live pid is taken at its word)."""
    ticks_since_boot = procfs.started(pid)
    if ticks_since_boot is None:
        return False
    try:
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError):
        return False
    started = boot + ticks_since_boot / ticks
    return started > moment + 2.0  # btime is whole seconds; leave room for rounding


class RunIndex:
    """The run records of the projects, read again only when a file's size or mtime moved."""

    def __init__(self, projects: Sequence[ProjectFolder]) -> None:
        self.projects = list(projects)
        self._cache: dict[Path, tuple[tuple[int, int], RunCard | None]] = {}

    def record_files(self) -> Iterable[tuple[ProjectFolder, Path]]:
        for project in self.projects:
            if not project.runs.is_dir():
                continue
            for entry in os.scandir(project.runs):
                if not entry.is_dir(follow_symlinks=False):
                    continue
                path = Path(entry.path) / "record.jsonl"
                yield project, path

    def summaries(self) -> list[RunCard]:
        """Every readable run, newest start first. A record is parsed again only when its
        size or mtime moved, or when the live run it was is no longer alive."""
        found = []
        kept: set[Path] = set()
        for project, path in self.record_files():
            try:
                info = os.lstat(path)
            except OSError:
                continue
            kept.add(path)
            stamp = (info.st_size, info.st_mtime_ns)
            cached = self._cache.get(path)
            stale = cached is None or cached[0] != stamp
            if not stale and cached is not None and cached[1] is not None and cached[1].live:
                stale = cached[1].pid is None or not alive(cached[1].pid)
            if stale:
                self._cache[path] = (stamp, self._read(project, path))
            summary = self._cache[path][1]
            if summary is not None:
                if summary.live:  # a quiet record (one long test): its run lasts until now
                    summary.duration = max(summary.duration, time.time() - summary.start)
                found.append(summary)
        for gone in set(self._cache) - kept:
            del self._cache[gone]
        return sorted(found, key=lambda s: -s.start)

    def _read(self, project: ProjectFolder, path: Path) -> RunCard | None:
        if path.is_symlink():
            return None
        try:
            record = read_record(path)
            # A record is a file anyone who can write the run folder may have damaged: one
            # whose fields have the wrong types is left off the page, never a 500.
            return summarise(project.key, record, _is_live(record))
        except (DevpoolError, ValueError, TypeError, KeyError, AttributeError, OverflowError):
            return None


def runs_view(summaries: Sequence[RunCard], live: bool) -> dict[str, Any]:
    """Live runs (progress so far) or recent ones (how they ended), newest first."""
    chosen = [s for s in summaries if s.live == live]
    if not live:
        chosen = chosen[:RECENT_LIMIT]
    return {"schema": SCHEMA, "runs": [s.to_json() for s in chosen]}


# ---- tests -------------------------------------------------------------------------------


def tests_view(projects: Sequence[ProjectFolder], today: dt.date | None = None) -> dict[str, Any]:
    """Per project: the flakiest tests over the history, quarantine entries with their
    expiry, and capacity by device count from the history."""
    from devpool.serve.history import capacity_rows, flakiest, quarantine_entries

    today = today or dt.date.today()
    out = []
    for project in projects:
        history = project.folder / "history.sqlite"
        flaky, capacity, problem = [], [], None
        if history.is_file() and not history.is_symlink():
            try:
                flaky = flakiest(history, HISTORY_WINDOW, FLAKY_LIMIT)
                capacity = capacity_rows(history)
            except DevpoolError as exc:
                problem = str(exc)
        entries, quarantine_problem = quarantine_entries(project.root, today)
        out.append(
            {
                "project": project.key,
                "history": str(history) if history.is_file() else None,
                "problem": problem or quarantine_problem,
                "flaky": flaky,
                "quarantine": entries,
                "capacity": capacity,
            }
        )
    return {"schema": SCHEMA, "projects": out, "generated": time.time()}
