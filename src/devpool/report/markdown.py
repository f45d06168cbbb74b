"""The run as Markdown: fit for GITHUB_STEP_SUMMARY (collapsible sections, plain tables)."""

from __future__ import annotations

import html

from devpool.report.record import LeakLine, RunRecord
from devpool.report.summary import NOT_RUN_SHOWN, RunSummary, name_lines, summarize, where
from devpool.report.terminal import strip_ansi
from devpool.wording import counted


def clean(text: str) -> str:
    """Test output as safe text: ANSI codes stripped, HTML escaped."""
    return html.escape(strip_ansi(text), quote=False)


def render_markdown(record: RunRecord) -> str:
    """The run's one summary (report.summary) as Markdown: counts, the tests of each named
    category, the tests that did not pass with their tails, device utilisation."""
    return summary_markdown(summarize(record))


def summary_markdown(summary: RunSummary) -> str:
    """A RunSummary as Markdown."""
    lines = [
        f"## devpool: {clean(summary.verdict)}",
        "",
        f"Run `{summary.run_id}` on {summary.platform} "
        f"({counted(len(summary.devices), 'device')}), {summary.duration:.1f} s.",
        "",
    ]
    if summary.damage:
        lines += [f"> **Record damaged:** {clean(summary.damage)}", ""]
    lines += ["| outcome | tests |", "| --- | ---: |"]
    lines += [f"| {name} | {count} |" for name, count in summary.counts()]
    lines.append("")
    for gap in summary.gaps:  # a queue run's classes that did not run
        lines += [f"> **{clean(gap.sentence)}**", ""]
    if summary.classes:
        lines += ["Per platform class:", "", *[f"- {clean(line)}" for line in summary.classes], ""]
    for heading, ids in name_lines(summary):
        lines += [f"### {clean(heading)}", ""]
        lines += [f"- `{clean(nodeid)}`" if nodeid[0] != "…" else f"- {nodeid}" for nodeid in ids]
        lines.append("")
    if summary.leaks:
        lines += [
            f"### Leaks: what {counted(len(summary.leaked()), 'test')} left behind "
            f"({len(summary.leaks)})",
            "",
            "| test | left | holds | ended |",
            "| --- | --- | --- | --- |",
        ]
        lines += [_leak_row(leak) for leak in summary.leaks[:NOT_RUN_SHOWN]]
        if len(summary.leaks) > NOT_RUN_SHOWN:
            lines += ["", f"… and {len(summary.leaks) - NOT_RUN_SHOWN} more (see --format json)"]
        lines.append("")
    if summary.repeats:
        lines += [
            "### Repeat results (lowest pass rate first)",
            "",
            "| passed | rate | test | failed on |",
            "| ---: | ---: | --- | --- |",
        ]
        lines += [
            f"| {row.passed}/{row.runs} | {row.rate:.0%} | `{clean(row.nodeid)}` | "
            + ", ".join(f"{clean(where)} ×{n}" for where, n in row.failed_on)
            + " |"
            for row in summary.repeats
        ]
        lines.append("")
    endings = [*summary.troubles, *[e for e in summary.flaky if e not in summary.troubles]]
    if endings:
        lines += [f"### Logs: tests that did not pass, and flaky ones ({len(endings)})", ""]
        for ending in endings:
            job = ending.job
            lines += [
                "<details>",
                f"<summary><b>{ending.label}</b> "
                f"<code>{clean(job.nodeid)}</code> [{where(summary.platform, job.devices)}] "
                f"{job.test_time:.2f}s — {clean(job.detail)}</summary>",
                "",
                f"log: `{clean(job.log)}`",
                "",
                "<pre>",
                *[clean(line) for line in job.tail],
                "</pre>",
                "</details>",
                "",
            ]
    if summary.use:
        lines += [
            "<details><summary>Device utilisation</summary>",
            "",
            "| device | leased | tests ran | jobs |",
            "| --- | ---: | ---: | ---: |",
        ]
        lines += [
            f"| {summary.platform}:{u.device} | {u.share(summary.duration):.0%} | "
            f"{u.test_share(summary.duration):.0%} | {u.jobs} |"
            for u in summary.use
        ]
        lines += ["", "</details>", ""]
    return "\n".join(lines) + "\n"


def _leak_row(leak: LeakLine) -> str:
    """One leak as a table row; a cell's text may hold anything a command line does."""
    pid = "?" if leak.pid is None else leak.pid
    left = {"thread": f"thread in pid {pid}", "memory": f"device memory in pid {pid}"}.get(
        leak.kind, f"pid {pid}"
    )
    what = f"{left} <code>{_cell(leak.command)}</code>" if leak.command else left
    if leak.fixture:
        what += f" (fixture {_cell(leak.fixture)})"
    ended = leak.ended or "reported"
    if leak.loud:
        ended = f"**{ended}**" + (f" (user {_cell(leak.user)})" if leak.user else "")
    holds = _cell("; ".join(leak.holds))
    return f"| <code>{_cell(leak.nodeid)}</code> | {what} | {holds} | {ended} |"


def _cell(text: str) -> str:
    """Text for a table cell: escaped, and no `|` or line break to end the cell early."""
    return clean(text).replace("|", "&#124;").replace("\n", " ")
