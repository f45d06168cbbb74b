"""The end-of-run failure summary and the per-test log files it points to."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from devpool.outcomes import Outcome
from devpool.report.record import JobRun
from devpool.report.summary import (
    INTERRUPTED,
    NOT_RUN,
    NOT_RUN_SHOWN,
    RunSummary,
    repeat_rows,
    where,
)
from devpool.wording import counted

TAIL_LINES = 50  # of a test's log, in the run record (reports rendered from it show them)
SUMMARY_TAIL = 5  # of a test's log, in the end-of-run summary: pytest showed the failure above
STACK_LINES = 20  # at most, of the stack of a timed-out test's own thread, in that summary
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


class _Gateway:
    def __init__(self, place: str) -> None:
        self.id = place


class Where(str):
    """Where a report ran, in the shape pytest's terminal reads xdist's worker from
    (`report.node.gateway.id`): under -v each line starts `[sim:2,3]` or `[cpu]`, as xdist's
    start `[gw0]`. A str, so a plugin that writes reports as JSON (pytest-reportlog) writes
    the place; one object per place, so --junitxml keys a test's phases alike."""

    # pytest writes this line above a failure of a report from an xdist worker: nothing here,
    # FAILURES reads as plain pytest's
    _workerinfocache = ""
    gateway: _Gateway


_PLACES: dict[str, Where] = {}


def where_ran(place: str) -> Where:
    """The one Where for a place ('sim:2,3', 'cpu')."""
    if place not in _PLACES:
        where = Where(place)
        where.gateway = _Gateway(place)
        _PLACES[place] = where
    return _PLACES[place]


def file_name(nodeid: str, attempt: int) -> str:
    """A name for one attempt of one test that any filesystem accepts."""
    name = _UNSAFE.sub("_", nodeid).strip("_")[-150:]
    return f"{name}.{attempt}" if attempt > 1 else name


def log_path(log_dir: Path, nodeid: str, attempt: int) -> Path:
    """Where one attempt of one test writes its log."""
    return log_dir / f"{file_name(nodeid, attempt)}.log"


def write_test_log(
    path: Path, header: Sequence[str], reports: Sequence[pytest.TestReport], extra: str = ""
) -> None:
    """Everything known about one test's run: header, failure text, captured output, extras."""
    parts = list(header)
    for report in reports:
        rerun = getattr(report, "devpool_outcome", None) == "rerun"
        if (report.failed or rerun) and report.longrepr is not None:
            parts.append(f"---- {report.when}: {report.outcome} ----")
            parts.append(report.longreprtext)
    # Each phase's report repeats the sections captured before it: the last one has them all.
    for title, content in reports[-1].sections if reports else ():
        parts.append(f"---- {title} ----")
        parts.append(content.rstrip("\n"))
    if extra:
        parts.append(extra)
    path.write_text("\n".join(parts) + "\n", encoding="utf-8", errors="replace")


# Terminal escape sequences: CSI (colours, cursor), OSC (titles, links) and two-byte ones.
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")


def strip_ansi(text: str) -> str:
    """Test output without terminal escape sequences, for Markdown, HTML and GitHub logs."""
    return _ANSI.sub("", text)


def read_log(path: Path) -> str:
    """A whole log as text ("" when it cannot be read), undecodable bytes replaced."""
    try:
        return path.read_text(encoding="utf-8", errors="replace").rstrip()
    except OSError:
        return ""


def tail(path: Path, lines: int = TAIL_LINES) -> list[str]:
    """The last lines of a file, read from its end so a large log costs little."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - 256 * 1024))
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]


def lend_endings(stats: dict[str, list[Any]]) -> list[tuple[str, Any]]:
    """Put the failed reports of devpool's own categories (timeout, crashed, infra, a gating
    flaky) among pytest's "failed" (call) or "error" (setup, teardown) terminal stats.

    pytest builds FAILURES, ERRORS and the short test summary from those two keys only; the
    reports keep their own word (CRASHED, TIMEOUT) there. Give them back with take_back
    before the closing line, which counts each category apart ("1 failed, 1 crashed").

    Every category's reports are put in collection order first, the order plain pytest ran
    and lists them in (FAILURES, -rA); what came before the run (collection errors) first.
    """
    lent: list[tuple[str, Any]] = []
    for key, reports in list(stats.items()):
        if key in ("", "failed", "error"):
            continue
        for report in reports:
            if getattr(report, "devpool_outcome", None) and getattr(report, "failed", False):
                into = "failed" if report.when == "call" else "error"
                stats.setdefault(into, []).append(report)
                lent.append((into, report))
    for key, reports in stats.items():
        if key != "warnings":  # in collection order already (run/warned.py)
            reports.sort(key=lambda report: getattr(report, "devpool_place", -1))
    return lent


def take_back(stats: dict[str, list[Any]], lent: list[tuple[str, Any]]) -> None:
    """Undo lend_endings. The keys stay, empty or not: pytest colours a run with one red."""
    for into, report in lent:
        stats[into] = [r for r in stats.get(into, []) if r is not report]


def write_apart(tr: Any, line: str, **markup: bool) -> None:
    """A line of devpool's own during the run (SLOW, waiting), on a line of its own.

    Without -v pytest's letters run on with no file name (as under xdist), so its
    write_line would glue the line to them: the letters so far end their line with the
    percentage first, as pytest ends a file's letters before the next file."""
    tw = tr._tw
    if not tr.currentfspath and tw.width_of_current_line and tr.config.get_verbosity() <= 0:
        if tr._show_progress_info:
            tr._write_progress_information_filling_space()
        tw.line()
    tr.write_line(line, **markup)


def print_repeats(tr: Any, results: Mapping[str, Sequence[tuple[Outcome, str]]]) -> None:
    """--devpool-repeat: each test's pass rate and the devices its failures happened on,
    the lowest pass rate first (then by node id)."""
    if not results:
        return
    tr.write_sep("-", "devpool: repeat results")
    as_text = {nodeid: [(o.value, where) for o, where in runs] for nodeid, runs in results.items()}
    for row in repeat_rows(as_text):
        tr.write_line(row.line(), red=bool(row.failed_on), green=not row.failed_on)


def _shown(path: str | Path, cwd: Path) -> str:
    try:
        return str(Path(path).relative_to(cwd))
    except ValueError:
        return str(path)


def summary_tail(path: Path, lines: int = SUMMARY_TAIL) -> list[str]:
    """The last lines of a test's log, without its header (the summary line says all that).

    A timed-out test's log ends with the stack of the thread that ran it (see worker/stacks.py):
    that whole stack, so the line the test hung on is always there."""
    text = tail(path)
    if text and text[0].startswith("test:"):  # the whole log: its header ends at the first ----
        text = text[next((i for i, line in enumerate(text) if line.startswith("---- ")), 0) :]
    current = [i for i, line in enumerate(text) if line.startswith("Current thread 0x")]
    if current and len(text) - current[-1] <= STACK_LINES:
        return text[current[-1] :]
    return text[-lines:]


def print_summary(tr: Any, summary: RunSummary, cwd: Path) -> None:
    """The block a reader finds at the end of the log: the run's one summary (report.summary).

    Short on purpose: pytest's FAILURES section above holds each failure in full. Here each
    test that did not pass gets its outcome, devices, reason, the logs of all its attempts and
    a few last lines; flaky, interrupted and not-run tests are named.
    """
    if summary.quarantined:
        tr.write_sep("-", f"devpool: {len(summary.quarantined)} quarantined, failed, not gating")
        for ending in summary.quarantined:
            job = ending.job
            tr.write_line(f"{ending.label:8} {job.nodeid} — {job.quarantined}  log: {job.log}")
    if summary.flaky:
        tr.write_sep("-", f"devpool: {len(summary.flaky)} flaky (failed, then passed on a rerun)")
        for ending in summary.flaky:
            logs = ", ".join(_shown(p, cwd) for p in [*ending.earlier, ending.job.log])
            where_ = where(summary.platform, ending.job.devices)
            tr.write_line(f"FLAKY    {ending.job.nodeid}  [{where_}]  logs: {logs}", yellow=True)
    for name, heading in (
        (INTERRUPTED, "running when the run ended"),
        (NOT_RUN, "the run ended before they started"),
    ):
        ids = [nodeid for nodeid in summary.tests.get(name, ()) if nodeid != "?"]
        if ids:
            tr.write_sep("-", f"devpool: {counted(len(ids), 'test')} {name} ({heading})")
            for nodeid in ids[:NOT_RUN_SHOWN]:
                tr.write_line(f"{name.upper():8} {nodeid}", yellow=True)
            if len(ids) > NOT_RUN_SHOWN:
                tr.write_line(
                    f"… and {len(ids) - NOT_RUN_SHOWN} more (devpool report --format json)"
                )
    print_leaks(tr, summary)
    if not summary.troubles:
        return
    count = len(summary.troubles)
    tr.write_sep("=", f"devpool: {counted(count, 'test')} did not pass", red=True)
    for ending in summary.troubles:
        job = ending.job
        tr.write_line(
            f"{ending.label:8} {job.nodeid}  [{_where(summary, job)}]  "
            f"{job.test_time:.2f}s  {job.detail}",
            red=True,
            bold=True,
        )
        tr.write_line(f"  log: {_shown(job.log, cwd)}")
        if ending.earlier:
            tr.write_line(
                f"  earlier attempts: {', '.join(_shown(p, cwd) for p in ending.earlier)}"
            )
        if job.artifacts:
            tr.write_line(f"  artifacts: {job.artifacts}")
        for line in summary_tail(Path(job.log)) if job.log else job.tail[-SUMMARY_TAIL:]:
            tr.write_line(f"  | {line}")


def print_leaks(tr: Any, summary: RunSummary) -> None:
    """The LEAK section: each thing a test left behind, what it could still see or hold, and
    how it ended (as the run's LEAK lines said when each was found)."""
    if not summary.leaks:
        return
    tests = len(summary.leaked())
    tr.write_sep(
        "-",
        f"devpool: {counted(len(summary.leaks), 'leak')} "
        f"({counted(tests, 'test')} left something behind)",
        yellow=True,
    )
    for leak in summary.leaks[:NOT_RUN_SHOWN]:
        tr.write_line(f"LEAK     {leak.line()}", red=leak.loud, yellow=not leak.loud)
    if len(summary.leaks) > NOT_RUN_SHOWN:
        tr.write_line(f"… and {len(summary.leaks) - NOT_RUN_SHOWN} more (devpool report)")


def _where(summary: RunSummary, job: JobRun) -> str:
    """Its devices; 'not started' for a test that needed devices and never got them."""
    if not job.devices and job.outcome == Outcome.INFRA.value and job.worker_pid is None:
        return "not started"
    return where(summary.platform, job.devices)
