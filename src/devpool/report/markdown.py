"""The run as Markdown: fit for GITHUB_STEP_SUMMARY (collapsible sections, plain tables)."""

from __future__ import annotations

import html

from devpool.report.record import RunRecord
from devpool.report.summary import device_use, not_run_lines, repeats, totals, troubles, verdict
from devpool.report.terminal import strip_ansi
from devpool.wording import counted


def clean(text: str) -> str:
    """Test output as safe text: ANSI codes stripped, HTML escaped."""
    return html.escape(strip_ansi(text), quote=False)


def render_markdown(record: RunRecord) -> str:
    """Totals per outcome, the tests that did not pass with their tails, device utilisation."""
    start = record.start
    lines = [
        f"## devpool: {clean(verdict(record))}",
        "",
        f"Run `{start.get('run_id', '?')}` on {record.platform} "
        f"({counted(len(record.devices), 'device')}), {record.duration():.1f} s.",
        "",
    ]
    if record.damage:
        lines += [f"> **Record damaged:** {clean(record.damage)}", ""]
    lines += ["| outcome | tests |", "| --- | ---: |"]
    lines += [f"| {name} | {count} |" for name, count in totals(record)]
    lines.append("")
    missing = not_run_lines(record)
    if missing:
        lines += [f"### {clean(missing[0].rstrip(':'))}", ""]
        lines += [f"- `{clean(nodeid)}`" for nodeid in missing[1:]]
        lines.append("")
    rows = repeats(record)
    if rows:
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
            for row in rows
        ]
        lines.append("")
    bad = troubles(record)
    if bad:
        lines += [f"### {len(bad)} did not pass", ""]
        for job in bad:
            where = f"{record.platform}:{','.join(map(str, job.devices))}" if job.devices else "cpu"
            lines += [
                "<details>",
                f"<summary><b>{job.outcome.upper() if job.outcome else '?'}</b> "
                f"<code>{clean(job.nodeid)}</code> [{where}] {job.test_time:.2f}s — "
                f"{clean(job.detail)}</summary>",
                "",
                f"log: `{clean(job.log)}`",
                "",
                "<pre>",
                *[clean(line) for line in job.tail],
                "</pre>",
                "</details>",
                "",
            ]
    use = device_use(record)
    if use:
        duration = record.duration()
        lines += [
            "<details><summary>Device utilisation</summary>",
            "",
            "| device | leased | tests ran | jobs |",
            "| --- | ---: | ---: | ---: |",
        ]
        lines += [
            f"| {record.platform}:{u.device} | {u.share(duration):.0%} | "
            f"{u.test_share(duration):.0%} | {u.jobs} |"
            for u in use
        ]
        lines += ["", "</details>", ""]
    return "\n".join(lines) + "\n"
