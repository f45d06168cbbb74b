"""The run as plain text, for `devpool report RECORD` in a terminal."""

from __future__ import annotations

from devpool.report.record import RunRecord
from devpool.report.summary import device_use, not_run_lines, repeats, totals, troubles, verdict
from devpool.wording import counted


def render_text(record: RunRecord, tail_lines: int = 50) -> str:
    """Verdict, totals, every test that did not pass with its log and tail, utilisation."""
    start = record.start
    out = [
        f"devpool run {start.get('run_id', '?')} on {record.platform} "
        f"({counted(len(record.devices), 'device')}), {record.duration():.1f} s",
        verdict(record),
    ]
    if record.damage:
        out.append(f"record damaged: {record.damage}")
    out.append(", ".join(f"{count} {name}" for name, count in totals(record)) or "no tests ran")
    missing = not_run_lines(record)
    if missing:
        out += [missing[0], *[f"  {line}" for line in missing[1:]]]
    rows = repeats(record)
    if rows:
        out.append("repeat results (lowest pass rate first):")
        out += [f"  {row.line()}" for row in rows]
    for job in troubles(record):
        where = f"{record.platform}:{','.join(map(str, job.devices))}" if job.devices else "cpu"
        out.append(
            f"{(job.outcome or '?').upper():8} {job.nodeid}  [{where}]  "
            f"{job.test_time:.2f}s  {job.detail}"
        )
        if job.log:
            out.append(f"  log: {job.log}")
        out += [f"  | {line}" for line in job.tail[-tail_lines:]]
    duration = record.duration()
    use = device_use(record)
    if use:
        out.append(
            "utilisation (share of the run a lease held each device, and its tests ran): "
            + "; ".join(u.line(record.platform, duration) for u in use)
        )
    return "\n".join(out) + "\n"
