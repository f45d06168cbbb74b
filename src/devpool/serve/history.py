"""The tests view's sources: flakiness and capacity from the duration history, quarantine
entries from the project's [tool.devpool] table and quarantine file. Read only."""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict, deque
from pathlib import Path
from typing import Any

from devpool.capacity.report import CollectedTest, report
from devpool.errors import DevpoolError
from devpool.history.durations import TestResult
from devpool.history.location import HistorySpec, open_history
from devpool.history.quarantine import Entry, entries_from_file, entries_from_table

LEAKED_RUNS = 2  # runs a test leaked in, of its last results, to be named without a flip


def _results(path: HistorySpec) -> list[TestResult]:
    with open_history(path, read_only=True) as history:
        return list(history.results())


def flakiest(path: Path, window: int, limit: int) -> list[dict[str, Any]]:
    """Tests whose last ``window`` results mix passes and failures, or that left something
    behind in several of them (leaks, issue 52), most mixed first.

    A result counts as flaky when its outcome is ``flaky`` (failed, then passed on a rerun),
    when it differs from the test's result in the run before (a flip), or when its test
    leaked: what it left ran beside the next tests on its devices, whatever its own outcome.
    """
    recent: dict[str, deque[TestResult]] = defaultdict(lambda: deque(maxlen=window))
    for result in _results(path):
        recent[result.nodeid].append(result)
    rows: list[dict[str, Any]] = []
    for nodeid, results in recent.items():
        outcomes = [r.outcome for r in results]
        counts = Counter(outcomes)
        flips = sum(1 for a, b in zip(outcomes, outcomes[1:], strict=False) if a != b)
        leaked = len({r.run_id or r.time for r in results if r.leaks})
        mixed = counts["flaky"] or (counts["failed"] and counts["passed"])
        if not mixed and leaked < LEAKED_RUNS:
            continue
        score = (counts["flaky"] + flips + leaked) / len(outcomes)
        rows.append(
            {
                "test": nodeid,
                "runs": len(outcomes),
                "passed": counts["passed"],
                "failed": counts["failed"],
                "flaky": counts["flaky"],
                "flips": flips,
                "leaked": leaked,  # runs in which it left something behind
                "score": round(score, 3),
                "last": outcomes[-1],
                "last_time": results[-1].time,
            }
        )
    rows.sort(key=lambda row: (-row["score"], -row["failed"], row["test"]))
    return rows[:limit]


def capacity_rows(path: Path) -> list[dict[str, Any]]:
    """Tests and device-seconds by device count, per platform, from each test's latest result
    (its device_count marker as the run saw it) and the history's p90 estimates."""
    latest: dict[tuple[str, str], TestResult] = {}
    for result in _results(path):
        latest[(result.platform, result.nodeid)] = result
    with open_history(path, read_only=True) as history:
        estimates = history.estimates()
    by_platform: dict[str, list[CollectedTest]] = defaultdict(list)
    pools: dict[str, int] = {}
    for (platform, nodeid), result in latest.items():
        by_platform[platform].append(
            CollectedTest(nodeid, result.device_count, 1, None, False, False)
        )
        pools[platform] = max(pools.get(platform, 1), result.device_count)
    rows = []
    for platform, tests in sorted(by_platform.items()):
        rep = report(tests, platform, None, estimates, 1.0, devices_per_runner=pools[platform])
        for row in rep.rows:
            rows.append(
                {
                    "platform": platform,
                    "devices": row.label,
                    "device_count": row.device_count,
                    "tests": row.enabled,
                    "test_seconds": round(row.test_seconds, 3),
                    "device_seconds": round(row.device_seconds, 3),
                }
            )
    return rows


def quarantine_entries(root: Path, today: dt.date) -> tuple[list[dict[str, Any]], str | None]:
    """The project's quarantine table and file entries (markers need a collection, so they
    show in each run's report instead), with their expiry; and a problem sentence, if any."""
    from devpool.project import project_settings

    try:
        settings = project_settings(root, (), {})
        entries: list[Entry] = entries_from_table(settings.quarantine, "[tool.devpool.quarantine]")
        file = _quarantine_file(root, settings.quarantine_file)
        if file is not None:
            entries += entries_from_file(file)
    except DevpoolError as exc:
        return [], str(exc)
    out = []
    for entry in entries:
        out.append(
            {
                "test": entry.key,
                "reason": entry.reason,
                "owner": entry.owner,
                "until": entry.until.isoformat() if entry.until else None,
                "expired": entry.expired(today),
                "days_left": (entry.until - today).days if entry.until else None,
                "platforms": list(entry.platforms) if entry.platforms else None,
                "source": entry.source,
            }
        )
    return out, None


def watched_files(root: Path) -> list[Path]:
    """The files the project's tests view reads besides its history: pyproject.toml and the
    quarantine file it names (an edit to either changes the page)."""
    from devpool.project import project_settings

    files = [root / "pyproject.toml"]
    try:
        quarantine = _quarantine_file(root, project_settings(root, (), {}).quarantine_file)
    except DevpoolError:
        return files
    return files if quarantine is None else [*files, quarantine]


def _quarantine_file(root: Path, named: Path | str | None) -> Path | None:
    if not named:
        return None
    file = Path(named)
    return file if file.is_absolute() else root / file
