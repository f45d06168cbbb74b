"""The HTML report's tables: tests that did not pass, leaks, tests that did not run, every test."""

from __future__ import annotations

from collections.abc import Sequence

from devpool.devices.inventory import format_ids
from devpool.outcomes import Outcome
from devpool.report.htmltext import breakable, escape, ints
from devpool.report.record import RunRecord
from devpool.report.summary import INTERRUPTED, NOT_RUN, Ending, RunSummary
from devpool.wording import duration

UNFINISHED = "running"


def troubles_section(summary: RunSummary) -> str:
    """The tests that did not pass, then the flaky and the quarantined ones, each with its tail
    (report.summary)."""
    if not summary.troubles and not summary.flaky and not summary.quarantined:
        passed = summary.count(Outcome.PASSED.value)
        return f'<section class="troubles"><h2>All {passed:,} tests passed</h2></section>'
    out = ['<section class="troubles">']
    for title, css, endings in (
        ("Tests that did not pass", "trouble", summary.troubles),
        ("Flaky: failed, then passed on a rerun", "flaky", summary.flaky),
        ("Quarantined: failed, not gating", "quarantined", summary.quarantined),
    ):
        if endings:
            out.append(f"<h2>{title} ({len(endings):,})</h2>")
            out.append(_endings_table(summary, css, endings))
    out.append("</section>")
    return "\n".join(out)


def _endings_table(summary: RunSummary, css: str, endings: Sequence[Ending]) -> str:
    label = "flaky" if css == "flaky" else ""  # its ending may be a later error: told apart
    out = [
        "<table><thead><tr><th>test</th><th>outcome</th><th>devices</th><th>attempt</th>"
        "<th>duration</th><th>detail</th><th>log</th></tr></thead><tbody>"
    ]
    for ending in endings:
        run = ending.job
        outcome = run.outcome or UNFINISHED
        devices = f"{summary.platform}:{format_ids(ints(run.devices))}" if run.devices else "cpu"
        out.append(
            f'<tr class="{css} outcome-{escape(outcome)}" data-nodeid="{escape(run.nodeid)}">'
            f'<td class="nodeid">{breakable(run.nodeid)}</td>'
            f'<td><span class="count outcome-{escape(outcome)}">'
            f"{escape(label or ending.label.lower())}</span></td>"
            f"<td>{escape(devices)}</td><td>{run.attempt}</td>"
            f"<td>{escape(duration(run.test_time))}</td>"
            f'<td class="detail">{escape(run.detail)}</td>'
            f'<td class="log"><code>{breakable(run.log)}</code></td></tr>'
        )
        if run.tail:
            out.append(
                f'<tr class="tail-row"><td colspan="7"><pre class="tail">'
                f"{escape(chr(10).join(run.tail))}</pre></td></tr>"
            )
    out.append("</tbody></table>")
    return "\n".join(out)


def leaks_section(summary: RunSummary) -> str:
    """What tests left behind (issue 52): each leak, what it could see or hold, how it ended."""
    if not summary.leaks:
        return ""
    out = [
        f'<section class="leaks"><h2>Leaks: what {len(summary.leaked()):,} tests left behind '
        f"({len(summary.leaks):,})</h2>",
        "<table><thead><tr><th>test</th><th>left</th><th>pid</th><th>command</th>"
        "<th>holds</th><th>ended</th></tr></thead><tbody>",
    ]
    for leak in summary.leaks:
        left = leak.kind + (f" (fixture {leak.fixture})" if leak.fixture else "")
        ended = leak.ended or "reported"
        if leak.loud and leak.user:
            ended += f" (user {leak.user})"
        out.append(
            f'<tr class="leak{" loud" if leak.loud else ""}" data-nodeid="{escape(leak.nodeid)}">'
            f'<td class="nodeid">{breakable(leak.nodeid)}</td><td>{escape(left)}</td>'
            f"<td>{escape('' if leak.pid is None else leak.pid)}</td>"
            f'<td class="detail"><code>{breakable(leak.command)}</code></td>'
            f"<td>{escape('; '.join(leak.holds))}</td><td>{escape(ended)}</td></tr>"
        )
    out.append("</tbody></table></section>")
    return "\n".join(out)


def not_run_section(summary: RunSummary) -> str:
    """The planned tests that never ended: interrupted (running when the run ended), not run."""
    out = []
    for name, css, title in (
        (INTERRUPTED, "interrupted", "Interrupted: running when the run ended"),
        (NOT_RUN, "not-run", "Not run"),
    ):
        ids = [nodeid for nodeid in summary.tests.get(name, ()) if nodeid != "?"]
        if not ids:
            continue
        out.append(f'<section class="{css}"><h2>{title} ({len(ids):,})</h2><ul>')
        out += [
            f'<li class="nodeid" data-nodeid="{escape(nodeid)}">{breakable(nodeid)}</li>'
            for nodeid in ids
        ]
        out.append("</ul></section>")
    return "\n".join(out)


def every_test_section(record: RunRecord) -> str:
    """Every attempt as a row, so each test can be found in the page (its bar links here)."""
    out = [
        f'<section class="tests"><h2>Every test ({len(record.jobs):,} attempts)</h2>',
        "<table><thead><tr><th>test</th><th>outcome</th><th>devices</th><th>attempt</th>"
        "<th>test time</th><th>start-up</th></tr></thead><tbody>",
    ]
    for index, run in enumerate(record.jobs):
        shown = run.shown or UNFINISHED
        devices = f"{record.platform}:{format_ids(ints(run.devices))}" if run.devices else "cpu"
        held = run.run_time if run.end is not None else 0.0
        startup = max(0.0, held - run.test_time)
        out.append(
            f'<tr id="test-{index}" class="test" data-nodeid="{escape(run.nodeid)}">'
            f'<td class="nodeid">{breakable(run.nodeid)}</td>'
            f'<td><span class="count outcome-{escape(shown)}">{escape(shown)}</span></td>'
            f"<td>{escape(devices)}</td><td>{run.attempt}</td>"
            f"<td>{escape(duration(run.test_time))}</td><td>{escape(duration(startup))}</td>"
            "</tr>"
        )
    out.append("</tbody></table></section>")
    return "\n".join(out)
