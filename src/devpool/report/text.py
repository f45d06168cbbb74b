"""The run as plain text, for `devpool report RECORD` in a terminal."""

from __future__ import annotations

from devpool.report.record import RunRecord
from devpool.report.summary import leak_lines, name_lines, summarize, where
from devpool.wording import counted


def render_text(record: RunRecord, tail_lines: int = 50) -> str:
    """Verdict, counts, the tests of each named category, what tests left behind (leaks), every
    test that did not pass with its log and tail, utilisation: the run's one summary
    (report.summary), as text."""
    summary = summarize(record)
    out = [
        f"devpool run {summary.run_id} on {summary.platform} "
        f"({counted(len(summary.devices), 'device')}), {summary.duration:.1f} s",
        summary.verdict,
    ]
    if summary.damage:
        out.append(f"record damaged: {summary.damage}")
    out.append(", ".join(f"{n} {name}" for name, n in summary.counts()) or "no tests ran")
    out += [gap.sentence for gap in summary.gaps]
    if summary.classes:
        out += ["per platform class:", *[f"  {line}" for line in summary.classes]]
    for heading, ids in name_lines(summary):
        out += [f"{heading}:", *[f"  {nodeid}" for nodeid in ids]]
    if summary.leaks:
        out.append(f"leaks ({len(summary.leaks)}, left behind by {len(summary.leaked())} tests):")
        out += [f"  {line}" for line in leak_lines(summary)]
    if summary.repeats:
        out.append("repeat results (lowest pass rate first):")
        out += [f"  {row.line()}" for row in summary.repeats]
    for ending in [*summary.troubles, *[e for e in summary.flaky if e not in summary.troubles]]:
        job = ending.job
        out.append(
            f"{ending.label:8} {job.nodeid}  [{where(summary.platform, job.devices)}]  "
            f"{job.test_time:.2f}s  {job.detail}"
        )
        if job.log:
            out.append(f"  log: {job.log}")
        if ending.earlier:
            out.append(f"  earlier attempts: {', '.join(ending.earlier)}")
        out += [f"  | {line}" for line in job.tail[-tail_lines:]]
    if summary.use:
        out.append(
            "utilisation (share of the run a lease held each device, and its tests ran): "
            + "; ".join(u.line(summary.platform, summary.duration) for u in summary.use)
        )
    return "\n".join(out) + "\n"
