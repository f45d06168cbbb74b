"""What earlier runs tell this one, and what this one leaves for the next.

In: the p90 durations of the history, and the quarantine entries that match the
collected tests. Out: this run's durations (or a shard's pending file), and the
quarantined tests that passed often enough to be released.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple, Protocol

import pytest

from devpool import procfs
from devpool.config import Settings
from devpool.devices.inventory import Inventory, Platform
from devpool.errors import DevpoolError
from devpool.history import preload
from devpool.history.durations import TestResult, results_bound
from devpool.history.location import HistorySpec, add_pending, history_found, open_history
from devpool.history.quarantine import Entry, Quarantine, entries_from_file, entries_from_table
from devpool.history.sql import SqlHistory
from devpool.outcomes import Outcome
from devpool.report.record import LiveRecord, RunRecord

RELEASE_AFTER = 5  # passes in a row after which a quarantined test is ready to release


class Estimates(NamedTuple):
    """What earlier runs say of each test: p90 duration, and a device test's CPU load."""

    durations: dict[str, float]
    cpu_loads: dict[str, float]


def read_estimates(
    history_path: HistorySpec,
    shard: tuple[int, int] | None,
    notes: list[str],
    platform: str | None = None,
    split: str | None = None,
) -> Estimates:
    """p90 durations and median CPU loads of earlier runs, those measured on `platform`
    first; a damaged history is a warning, not a failed run.

    Pending results of shard runs are never read as estimates: a run that is not a shard
    folds them into the history first; a shard splits from the history alone, and with
    `split` (shard_split) from the figures the first shard of its CI run read.
    """
    if not history_found(history_path, pending=shard is None):
        return Estimates({}, {})
    try:
        with open_history(history_path, read_only=shard is not None) as history:
            if shard is None:
                history.merge_pending()
            found = Estimates(
                history.estimates(platform=platform), history.cpu_loads(platform=platform)
            )
            if shard is not None and split is not None:
                pinned = history.pinned(split, found._asdict())
                found = Estimates(pinned["durations"], pinned["cpu_loads"])
            return found
    except DevpoolError as exc:
        notes.append(f"duration history not used: {exc}")
        return Estimates({}, {})


def class_estimates(
    history_path: HistorySpec, notes: list[str], fallback: Mapping[str, float], default: float
) -> Callable[[str, Sequence[str]], float]:
    """The estimate of a test of another class (a queue run's test this platform deselects):
    the durations measured on its class's platform first, read once per platform."""
    read: dict[str, dict[str, float]] = {}

    def estimate_of(nodeid: str, platforms: Sequence[str]) -> float:
        for name in sorted(platforms):
            if name not in read:
                read[name] = read_estimates(history_path, None, notes, name).durations
            if nodeid in read[name]:
                return read[name][nodeid]
        return fallback.get(nodeid, default)

    return estimate_of


def shard_split(
    shard: tuple[int, int] | None, nodeids: Iterable[str], environ: Mapping[str, str]
) -> str | None:
    """What names one CI run's shards of one suite: the GitHub Actions run and attempt, the
    shard count and the collected tests; None elsewhere (each shard reads the history as
    it finds it)."""
    run, attempt = environ.get("GITHUB_RUN_ID"), environ.get("GITHUB_RUN_ATTEMPT")
    if shard is None or not (run and attempt):
        return None
    tests = hashlib.sha256("\n".join(sorted(nodeids)).encode("utf-8")).hexdigest()[:16]
    return f"{run}-{attempt}/{shard[1]}/{tests}"


def match_quarantine(
    items: list[pytest.Item],
    settings: Settings,
    platform: Platform,
    quarantined: dict[str, Entry],
    notes: list[str],
) -> None:
    """Fill quarantined (node id → entry) for the collected items; expired or unmatched
    entries go to notes, or raise under --devpool-strict-quarantine."""
    entries = entries_from_table(settings.quarantine, "[tool.devpool.quarantine]")
    if settings.quarantine_file is not None:
        entries += entries_from_file(settings.quarantine_file)
    book = Quarantine(entries, platform.name, platform.kind)
    for item in items:
        entry = book.find(item)
        if entry is not None:
            quarantined[item.nodeid] = entry
    today = dt.date.today()
    stale = {e.key: e for e in [*entries, *quarantined.values()] if e.expired(today)}
    for entry in stale.values():
        text = (
            f"quarantine of {entry.key} expired on {entry.until} ({entry.describe()}; "
            f"{entry.source})"
        )
        if settings.strict_quarantine:
            raise DevpoolError(text + "; renew or remove it (--devpool-strict-quarantine)")
        notes.append(text)
    for entry in book.unmatched():
        notes.append(f"quarantine entry {entry.key!r} ({entry.source}) matches no collected test")


class Leaving(Protocol):
    """What the controller leaves for the next runs at the end of this one."""

    settings: Settings
    inventory: Inventory
    history_path: HistorySpec
    results: list[TestResult]
    live_record: LiveRecord
    shard: tuple[int, int] | None
    run_id: str
    quarantined: dict[str, Entry]
    quarantine_notes: list[str]
    imported: dict[int, dict[str, None]]
    preload_file: Path


def leave_for_next(ctx: Leaving, exitstatus: int) -> list[str]:
    """This run's durations (with its leaks) and cost into the history, and what each
    kind's template imports first next time; the quarantined tests now ready to release."""
    # What the run cost beyond its tests (capacity's fixed cost): runs that ended as
    # runs do, each test once.
    age = process_age()
    cost = None
    if age is not None and ctx.settings.repeat == 1 and int(exitstatus) in (0, 1):
        cost = (ctx.inventory.platform.name, len(ctx.inventory.devices), age)
    releasable = write_results(
        ctx.history_path,
        with_leaks(ctx.results, ctx.live_record.record),
        ctx.shard,
        ctx.run_id,
        ctx.quarantined,
        ctx.quarantine_notes,
        cost,
    )
    if ctx.imported:  # what each kind's template imports first next time
        preload.write(ctx.preload_file, ctx.imported)
    return releasable


def with_leaks(results: list[TestResult], record: RunRecord) -> list[TestResult]:
    """Each result with what its test left behind over its attempts (the record's `leak`
    lines, issue 52), 0 for none; as they were where the run did not look for leaks."""
    if not record.leaks_checked:
        return results
    # A result is its test's final attempt: the job_end whose end is the result's time.
    jobs = {(job.test_id, job.end): job.job for job in record.finished_jobs() if not job.retried}
    found = Counter(leak.job for leak in record.leaks)
    out = []
    for result in results:
        job = jobs.get((result.nodeid, round(result.time, 3)))
        out.append(replace(result, leaks=found.get(job, 0) if job is not None else 0))
    return out


def write_results(
    history_path: HistorySpec,
    results: list[TestResult],
    shard: tuple[int, int] | None,
    run_id: str,
    quarantined: dict[str, Entry],
    notes: list[str],
    cost: tuple[str, int, float] | None = None,
) -> list[str]:
    """Add this run's durations to the history; a shard run's wait as pending results.
    The quarantined tests now ready to release.

    The other shards of a CI run split from the history as it was: a shard that
    changed it would change their split (tests run twice or never).
    """
    releasable: list[str] = []
    if not results:
        return releasable
    try:
        if shard is None:
            with open_history(history_path) as history:
                history.add(results)
                if cost is not None:  # (platform, devices, wall): for capacity's fixed cost
                    platform, devices, wall = cost
                    bound = results_bound(results, devices)
                    tests = len({r.nodeid for r in results})
                    history.add_run_cost(run_id, platform, devices, tests, wall, bound)
                releasable = _ready_to_release(history, results, quarantined)
            return releasable
        add_pending(history_path, run_id, results)
        names = sorted({r.nodeid for r in results if r.nodeid in quarantined})
        if names and history_found(history_path):
            passed = [Outcome.PASSED.value] * RELEASE_AFTER
            with open_history(history_path, read_only=True) as history:
                releasable = [
                    n for n in names if history.recent_outcomes(n, RELEASE_AFTER, results) == passed
                ]
    except (DevpoolError, OSError) as exc:
        notes.append(f"duration history not written: {exc}")
    return releasable


def _ready_to_release(
    history: SqlHistory, results: list[TestResult], quarantined: dict[str, Entry]
) -> list[str]:
    """Quarantined tests that passed the last RELEASE_AFTER times they ran."""
    names = sorted({r.nodeid for r in results if r.nodeid in quarantined})
    passed = [Outcome.PASSED.value] * RELEASE_AFTER
    return [n for n in names if history.recent_outcomes(n, RELEASE_AFTER) == passed]


def process_age() -> float | None:
    """Seconds since this process started (the interpreter's start included); None where
    the system does not say (/proc)."""
    started = procfs.started("self")
    if started is None:
        return None
    try:
        with open("/proc/uptime", encoding="ascii") as uptime:
            now = float(uptime.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, now - started / os.sysconf("SC_CLK_TCK"))
