"""The end-of-run failure summary and the per-test log files it points to."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from devpool.outcomes import Outcome

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


def log_path(log_dir: Path, nodeid: str, attempt: int) -> Path:
    """A file name for one test's log that any filesystem accepts."""
    name = _UNSAFE.sub("_", nodeid).strip("_")[-150:]
    suffix = f".{attempt}" if attempt > 1 else ""
    return log_dir / f"{name}{suffix}.log"


def write_test_log(
    path: Path, header: Sequence[str], reports: Sequence[pytest.TestReport], extra: str = ""
) -> None:
    """Everything known about one test's run: header, failure text, captured output, extras."""
    parts = list(header)
    for report in reports:
        if report.failed and report.longrepr is not None:
            parts.append(f"---- {report.when}: {report.outcome} ----")
            parts.append(report.longreprtext)
    # Each phase's report repeats the sections captured before it: the last one has them all.
    for title, content in reports[-1].sections if reports else ():
        parts.append(f"---- {title} ----")
        parts.append(content.rstrip("\n"))
    if extra:
        parts.append(extra)
    path.write_text("\n".join(parts) + "\n", encoding="utf-8", errors="replace")


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


def print_summary(writer: object, troubles: Sequence[Trouble], cwd: Path) -> None:
    """The block a reader finds at the end of the log: every test that did not pass."""
    tr = writer  # pytest's TerminalReporter
    if not troubles:
        return
    count = len(troubles)
    tr.write_sep("=", f"devpool: {count} test{'s' if count != 1 else ''} did not pass", red=True)  # type: ignore[attr-defined]
    for trouble in troubles:
        try:
            shown = trouble.log.relative_to(cwd)
        except ValueError:
            shown = trouble.log
        tr.write_line(  # type: ignore[attr-defined]
            f"{trouble.outcome.value.upper():8} {trouble.nodeid}  [{trouble.devices}]  "
            f"{trouble.duration:.2f}s  {trouble.detail}",
            red=True,
            bold=True,
        )
        tr.write_line(f"  log: {shown}")  # type: ignore[attr-defined]
        for line in tail(trouble.log):
            tr.write_line(f"  | {line}")  # type: ignore[attr-defined]
