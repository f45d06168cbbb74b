"""GitHub Actions: a collapsed group per job, annotations per failure, the step summary.

Workflow commands are lines starting with `::`. Anything a test printed is escaped and
fenced with `::stop-commands::` so test output can never inject a command into the log.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from devpool.report.record import RunRecord
from devpool.report.summary import RunSummary, where
from devpool.report.terminal import strip_ansi, tail

GROUP_LOG_LINES = 400


def enabled(flag: bool | None, environ: Mapping[str, str]) -> bool:
    """--devpool-github / --devpool-no-github win; otherwise detect GitHub Actions."""
    return flag if flag is not None else environ.get("GITHUB_ACTIONS") == "true"


def escape_data(text: str) -> str:
    """GitHub's escaping for a command's message."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """GitHub's escaping for a command's property value (file=, title=)."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def safe_line(text: str) -> str:
    """A line of test output as plain text: no ANSI codes, no control characters."""
    text = strip_ansi(text)
    return "".join(ch if ch.isprintable() or ch == "\t" else "?" for ch in text)


def annotation(
    title: str,
    message: str,
    file: str | None = None,
    line: int | None = None,
    level: str = "error",
) -> str:
    props = []
    if file:
        props.append(f"file={escape_property(file)}")
        if line:
            props.append(f"line={line}")
    props.append(f"title={escape_property(title)}")
    return f"::{level} {','.join(props)}::{escape_data(message)}"


class GitHubLog:
    """Follows the run's job_end events and writes the groups and annotations at the end."""

    def __init__(self, platform: str, locations: Mapping[str, tuple[str, int | None, str]]) -> None:
        self.platform = platform
        self.locations = locations
        self.ended: list[Mapping[str, Any]] = []
        self._fence = secrets.token_hex(8)

    def open_fence(self) -> str:
        """Stop GitHub reading workflow commands from the output that follows."""
        return f"::stop-commands::{self._fence}"

    def close_fence(self) -> str:
        return f"::{self._fence}::"

    def event(self, event_type: str, fields: Mapping[str, Any]) -> None:
        if event_type == "job_end":
            self.ended.append(fields)

    def _where(self, fields: Mapping[str, Any]) -> str:
        devices = fields.get("devices") or []
        return f"{self.platform}:{','.join(map(str, devices))}" if devices else "cpu"

    def groups(self) -> list[str]:
        """One collapsed group per job: its outcome line, then its log, fenced from commands."""
        lines: list[str] = []
        for fields in self.ended:
            outcome = str(fields["outcome"])
            head = (
                f"{outcome.upper()} {fields['nodeid']} [{self._where(fields)}] "
                f"{fields.get('run_time', 0.0):.2f}s, queue {fields.get('queue_wait', 0.0):.2f}s"
            )
            lines.append(f"::group::{escape_data(safe_line(head))}")
            log = fields.get("log")
            if log:
                token = secrets.token_hex(8)
                lines.append(f"::stop-commands::{token}")
                lines += [safe_line(line) for line in tail(Path(log), GROUP_LOG_LINES)]
                lines.append(f"::{token}::")
            lines.append("::endgroup::")
        return lines

    def annotations(self, summary: RunSummary) -> list[str]:
        """One ::error per test that did not pass (the run's one summary), pointing at the
        test's file and line; one ::warning per leak (::error for one devpool may not end)."""
        lines = []
        for ending in summary.troubles:
            job = ending.job
            path, lineno, _ = self.locations.get(
                job.test_id, (job.test_id.split("::")[0], None, "")
            )
            title = f"{ending.label} {job.nodeid}"
            if job.outcome not in ("failed", "error"):
                title += f" on {where(summary.platform, job.devices)}"
            body = [job.detail]
            body += [safe_line(line) for line in job.tail[-15:]]
            lines.append(
                annotation(title, "\n".join(body), path, lineno + 1 if lineno is not None else None)
            )
        for leak in summary.leaks:  # a warning: in fail mode the test's error says it too
            path, lineno = self._place(leak.nodeid)
            lines.append(
                annotation(
                    f"LEAK {leak.nodeid}",
                    safe_line(leak.what()),
                    path,
                    lineno,
                    "error" if leak.loud else "warning",
                )
            )
        return lines

    def _place(self, nodeid: str) -> tuple[str, int | None]:
        """The file and 1-based line of a test, for an annotation."""
        test = nodeid.split("[", 1)[0] if nodeid not in self.locations else nodeid
        path, lineno, _ = self.locations.get(test, (nodeid.split("::")[0], None, ""))
        return path, lineno + 1 if lineno is not None else None


def write_step_summary(record: RunRecord, environ: Mapping[str, str] | None = None) -> bool:
    """Append the run's Markdown to GITHUB_STEP_SUMMARY; False when there is none to append to."""
    env = os.environ if environ is None else environ
    target = env.get("GITHUB_STEP_SUMMARY")
    if not target:
        return False
    from devpool.report.markdown import render_markdown  # only a GitHub run writes Markdown

    with open(target, "a", encoding="utf-8") as handle:
        handle.write(render_markdown(record))
    return True
