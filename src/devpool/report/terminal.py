"""The end-of-run failure summary and the per-test log files it points to."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devpool.outcomes import Outcome
from devpool.report.summary import repeat_rows

TAIL_LINES = 50
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class Trouble:
    """One test that did not pass, as the summary shows it."""

    nodeid: str
    outcome: Outcome
    devices: str  # "sim:2,3" or "cpu"
    duration: float
    detail: str  # "exit code 1", "SIGKILL (signal 9)", "killed after 5s limit", reason for infra
    log: Path
    gating: bool = True  # False for a flaky test that passed on a rerun
    artifacts: Path | None = None  # its devpool_artifacts folder, kept because it failed


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


def print_repeats(tr: Any, results: Mapping[str, Sequence[tuple[Outcome, str]]]) -> None:
    """--devpool-repeat: each test's pass rate and the devices its failures happened on,
    the lowest pass rate first (then by node id)."""
    if not results:
        return
    tr.write_sep("-", "devpool: repeat results")
    as_text = {nodeid: [(o.value, where) for o, where in runs] for nodeid, runs in results.items()}
    for row in repeat_rows(as_text):
        tr.write_line(row.line(), red=bool(row.failed_on), green=not row.failed_on)


def print_summary(tr: Any, troubles: Sequence[Trouble], cwd: Path) -> None:
    """The block a reader finds at the end of the log: every test that did not pass."""
    flaky = [t for t in troubles if not t.gating]
    if flaky:
        tr.write_sep("-", f"devpool: {len(flaky)} flaky (failed, then passed on a rerun)")
        for trouble in flaky:
            tr.write_line(
                f"FLAKY    {trouble.nodeid}  [{trouble.devices}]  log: {trouble.log}", yellow=True
            )
    troubles = [t for t in troubles if t.gating]
    if not troubles:
        return
    count = len(troubles)
    tr.write_sep("=", f"devpool: {count} test{'s' if count != 1 else ''} did not pass", red=True)
    for trouble in troubles:
        try:
            shown = trouble.log.relative_to(cwd)
        except ValueError:
            shown = trouble.log
        tr.write_line(
            f"{trouble.outcome.value.upper():8} {trouble.nodeid}  [{trouble.devices}]  "
            f"{trouble.duration:.2f}s  {trouble.detail}",
            red=True,
            bold=True,
        )
        tr.write_line(f"  log: {shown}")
        if trouble.artifacts is not None:
            tr.write_line(f"  artifacts: {trouble.artifacts}")
        for line in tail(trouble.log):
            tr.write_line(f"  | {line}")
