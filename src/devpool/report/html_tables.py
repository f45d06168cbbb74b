"""The HTML report's tables: tests that did not pass, tests that did not run, every test."""

from __future__ import annotations

from devpool.outcomes import Outcome
from devpool.report.htmltext import duration, escape, ints, ranges
from devpool.report.record import JobRun, RunRecord

UNFINISHED = "running"
_QUIET = frozenset({Outcome.PASSED.value, Outcome.SKIPPED.value})


def troubled(record: RunRecord) -> list[JobRun]:
    """Final attempts that did not pass, then jobs the cut left running."""
    done = [run for run in record.final_attempts() if run.outcome not in _QUIET]
    return done + [run for run in record.jobs if run.outcome is None]


def troubles_section(record: RunRecord) -> str:
    runs = troubled(record)
    if not runs:
        passed = record.counts()[Outcome.PASSED.value]
        return f'<section class="troubles"><h2>All {passed:,} tests passed</h2></section>'
    out = [
        f'<section class="troubles"><h2>Tests that did not pass ({len(runs):,})</h2>',
        "<table><thead><tr><th>test</th><th>outcome</th><th>devices</th><th>attempt</th>"
        "<th>duration</th><th>detail</th><th>log</th></tr></thead><tbody>",
    ]
    for run in runs:
        outcome = run.outcome or UNFINISHED
        devices = f"{record.platform}:{ranges(ints(run.devices))}" if run.devices else "cpu"
        took = duration(run.test_time) if run.end is not None else "—"
        out.append(
            f'<tr class="trouble outcome-{escape(outcome)}" data-nodeid="{escape(run.nodeid)}">'
            f'<td class="nodeid">{escape(run.nodeid)}</td>'
            f'<td><span class="count outcome-{escape(outcome)}">{escape(outcome)}</span></td>'
            f"<td>{escape(devices)}</td><td>{run.attempt}</td><td>{escape(took)}</td>"
            f'<td class="detail">{escape(run.detail)}</td>'
            f'<td class="log"><code>{escape(run.log)}</code></td></tr>'
        )
        if run.tail:
            out.append(
                f'<tr class="tail-row"><td colspan="7"><pre class="tail">'
                f"{escape(chr(10).join(run.tail))}</pre></td></tr>"
            )
    out.append("</tbody></table></section>")
    return "\n".join(out)


def not_run_section(record: RunRecord) -> str:
    """The planned tests that never ended (an interrupted or cut run)."""
    missing = record.not_run()
    if not missing:
        return ""
    out = [f'<section class="not-run"><h2>Not run ({len(missing):,})</h2><ul>']
    out += [
        f'<li class="nodeid" data-nodeid="{escape(nodeid)}">{escape(nodeid)}</li>'
        for nodeid in missing
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
        devices = f"{record.platform}:{ranges(ints(run.devices))}" if run.devices else "cpu"
        held = run.run_time if run.end is not None else 0.0
        startup = max(0.0, held - run.test_time)
        out.append(
            f'<tr id="test-{index}" class="test" data-nodeid="{escape(run.nodeid)}">'
            f'<td class="nodeid">{escape(run.nodeid)}</td>'
            f'<td><span class="count outcome-{escape(shown)}">{escape(shown)}</span></td>'
            f"<td>{escape(devices)}</td><td>{run.attempt}</td>"
            f"<td>{escape(duration(run.test_time))}</td><td>{escape(duration(startup))}</td>"
            "</tr>"
        )
    out.append("</tbody></table></section>")
    return "\n".join(out)
