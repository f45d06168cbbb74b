"""A run record as one self-contained HTML page: header, device timeline, tests that did not pass.

The page is inline CSS and SVG only (no script, no font, no network), so it can be attached
to a CI run and opened anywhere. Every text that comes from the record is escaped here, once:
node ids carry brackets and quotes, and test output carries anything at all.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from devpool.devices.inventory import format_ids
from devpool.outcomes import Outcome
from devpool.report.html_tables import (
    UNFINISHED,
    every_test_section,
    leaks_section,
    not_run_section,
    troubles_section,
)
from devpool.report.htmltext import escape
from devpool.report.htmltext import ints as _ints
from devpool.report.memory_lane import CSS as MEMORY_CSS
from devpool.report.memory_lane import capacities, memory_section, read_holds
from devpool.report.record import JobRun, RunRecord
from devpool.report.summary import INTERRUPTED, XFAILED, XPASSED, RunSummary, summarize
from devpool.report.summary import NOT_RUN as NOT_RUN_NAME
from devpool.wording import counted, duration

# Bar colors by outcome; "running" is a job the record never saw end (a cut run).
OUTCOME_COLORS: dict[str, str] = {
    Outcome.PASSED.value: "#2ea043",
    Outcome.FAILED.value: "#d1242f",
    Outcome.ERROR.value: "#a40e26",
    Outcome.TIMEOUT.value: "#f08c00",
    Outcome.CRASHED.value: "#8250df",
    Outcome.INFRA.value: "#8c959f",
    Outcome.SKIPPED.value: "#d0d7de",
    Outcome.FLAKY.value: "#e3b341",
    XFAILED: "#bf8700",
    XPASSED: "#6fdd8b",
    "running": "#54aeff",
}
NOT_RUN = "not-run"
STARTUP_COLOR = "#8c959f"  # worker start-up (or a lease's wait) before the test began

LABEL_WIDTH = 96
PLOT_WIDTH = 1180
ROW_HEIGHT = 20
BAR_HEIGHT = 14
AXIS_HEIGHT = 26
GROUP_GAP = 10
MIN_BAR_WIDTH = 2.0


@dataclass(frozen=True)
class _Bar:
    """One attempt of one job, placed on the time axis (seconds since session start)."""

    run: JobRun
    begin: float  # its devices held from here (worker start-up included)
    finish: float
    outcome: str  # an Outcome value, xfailed/xpassed, or UNFINISHED
    index: int = 0  # its row in the table of every test

    @property
    def test_begin(self) -> float:
        """Where the test's own time starts: what came before it is start-up."""
        if self.run.end is None:
            return self.begin
        return min(self.finish, max(self.begin, self.finish - self.run.test_time))

    def extent(self, scale: float) -> tuple[float, float]:
        """Left and right edge in pixels as drawn (a short test still MIN_BAR_WIDTH wide)."""
        left = self.begin * scale
        right = max(self.finish * scale, self.test_begin * scale + MIN_BAR_WIDTH)
        return left, right


def render_html(record: RunRecord) -> str:
    """The whole report for one run record, as a self-contained HTML document."""
    summary = summarize(record)
    origin = _origin(record)
    bars = _bars(record, origin)
    span = max([record.duration(), *(bar.finish for bar in bars), 1e-3])
    title = f"devpool run {record.start.get('run_id', record.path.name)}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(title)}</title>",
        f"<style>{_CSS}{MEMORY_CSS}</style>",
        "</head><body>",
        _header(record, summary, origin, title),
        _legend(),
        _timeline(record, bars, span),
        memory_section(
            record.platform,
            read_holds(record.path, origin),
            capacities(record.start),
            LABEL_WIDTH,
            PLOT_WIDTH,
            span,
        ),
        troubles_section(summary),
        leaks_section(summary),
        not_run_section(summary),
        every_test_section(record),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


# ---- data ----------------------------------------------------------------------------------


def _origin(record: RunRecord) -> float:
    """Time zero of the axis: the session start, or the first job if the start has no time."""
    if "time" in record.start:
        return float(record.start["time"])
    starts = [run.start for run in record.jobs if run.start is not None]
    return min(starts, default=0.0)


def _bars(record: RunRecord, origin: float) -> list[_Bar]:
    """Every attempt that ran for some time; one still running at the cut ends at the cut."""
    cut_at = record.duration() if record.finished else max(record.last_time - origin, 0.0)
    bars = []
    for index, run in enumerate(record.jobs):
        if run.start is None:
            continue  # never held anything: infra before a lease, or unsatisfiable
        begin = run.start - origin
        finish = run.end - origin if run.end is not None else max(cut_at, begin)
        bars.append(_Bar(run, begin, max(finish, begin), run.shown or UNFINISHED, index))
    return bars


def _device_ids(record: RunRecord, bars: Iterable[_Bar]) -> list[int]:
    ids = set(record.devices)
    for bar in bars:
        ids.update(_ints(bar.run.devices))
    return sorted(ids)


def _lanes(bars: Sequence[_Bar], scale: float) -> list[list[_Bar]]:
    """Stack bars into as few lanes as needed (first lane that is free), by their drawn
    extent: no bar covers another, however short the tests."""
    lanes: list[list[_Bar]] = []
    rights: list[float] = []
    for bar in sorted(bars, key=lambda b: (b.begin, b.finish)):
        left, right = bar.extent(scale)
        for number, edge in enumerate(rights):
            if edge <= left + 1e-6:
                lanes[number].append(bar)
                rights[number] = right
                break
        else:
            lanes.append([bar])
            rights.append(right)
    return lanes


# ---- header --------------------------------------------------------------------------------


def _header(record: RunRecord, summary: RunSummary, origin: float, title: str) -> str:
    devices = record.devices
    where = f"{record.platform}:{format_ids(devices)}" if devices else record.platform
    started = datetime.datetime.fromtimestamp(origin, tz=datetime.timezone.utc)
    facts = [
        ("platform", f"{where} ({counted(len(devices), 'device')})"),
        ("host", str(record.start.get("host", "?"))),
        ("started", started.strftime("%Y-%m-%d %H:%M:%S UTC")),
        ("duration", duration(record.duration())),
    ]
    if record.end is not None and "exitstatus" in record.end:
        facts.append(("exit status", str(record.end["exitstatus"])))
    lines = [f'<header><h1>{escape(title)}</h1><dl class="facts">']
    lines += [f"<dt>{escape(name)}</dt><dd>{escape(value)}</dd>" for name, value in facts]
    lines.append("</dl>")
    if summary.interrupted or summary.cut is not None:
        tone = "cut"
    elif summary.exitstatus == 0:
        tone = "finished"
    else:
        tone = "finished failing"
    # The banner says what happened: the verdict names what failed, not only that it ended.
    lines.append(f'<p class="status {tone}">{escape(summary.verdict)}.</p>')
    if record.damage:
        lines.append(f'<p class="status damage">{escape(record.damage)}</p>')
    lines.append(_totals(summary))
    lines.append("</header>")
    return "\n".join(lines)


def _totals(summary: RunSummary) -> str:
    css = {INTERRUPTED: UNFINISHED, NOT_RUN_NAME: NOT_RUN}
    chips = [
        f'<span class="count outcome-{escape(css.get(name, name))}" data-outcome="{escape(name)}">'
        f"{count:,} {escape(name)}</span>"
        for name, count in summary.counts()
    ]
    total = f"{summary.planned:,} tests planned"
    return f'<p class="totals">{" ".join(chips) or "no test finished"} <span>— {total}</span></p>'


def _legend() -> str:
    items = [
        f'<span class="key"><i class="swatch outcome-{name}"></i>{name}</span>'
        for name in OUTCOME_COLORS
    ]
    items.append('<span class="key"><i class="swatch startup"></i>start-up (thin)</span>')
    return f'<p class="legend">{"".join(items)}</p>'


# ---- timeline ------------------------------------------------------------------------------


def _timeline(record: RunRecord, bars: Sequence[_Bar], span: float) -> str:
    scale = PLOT_WIDTH / span
    on_devices = [bar for bar in bars if bar.run.devices]
    cpu_lanes = _lanes([bar for bar in bars if not bar.run.devices], scale)
    device_ids = _device_ids(record, on_devices)
    device_lanes = {
        device: _lanes([bar for bar in on_devices if device in _ints(bar.run.devices)], scale)
        or [[]]
        for device in device_ids
    }
    rows_height = ROW_HEIGHT * (sum(map(len, device_lanes.values())) + len(cpu_lanes))
    height = AXIS_HEIGHT + rows_height + (GROUP_GAP if cpu_lanes else 0) + 8
    width = LABEL_WIDTH + PLOT_WIDTH + 16
    out = [
        '<section class="timeline"><h2>Timeline</h2>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="device timeline">',
    ]
    out.append(_axis(span, scale, height))
    y = AXIS_HEIGHT
    for device in device_ids:
        out.append(f'<g class="device-row" data-device="{device}">')
        for number, lane in enumerate(device_lanes[device]):
            label = f"{record.platform}:{device}" if number == 0 else ""
            out.append(_row(label, y, lane, scale, record.platform, device))
            y += ROW_HEIGHT
        out.append("</g>")
    if cpu_lanes:
        y += GROUP_GAP
        out.append('<g class="cpu-group">')
        for number, lane in enumerate(cpu_lanes):
            # Lanes are room for short bars, not CPU slots: only the first is named, as a
            # device's extra lanes are ("cpu 2".."cpu 8" for a run of 2 slots misled).
            label = "cpu" if number == 0 else ""
            out.append(f'<g class="cpu-row" data-lane="{number}">')
            out.append(_row(label, y, lane, scale, record.platform, None))
            out.append("</g>")
            y += ROW_HEIGHT
        out.append("</g>")
    out.append("</svg></section>")
    return "\n".join(out)


def _axis(span: float, scale: float, height: float) -> str:
    step = _tick_step(span)
    out = ['<g class="axis">']
    count = int(span / step + 1e-9)
    for index in range(count + 1):
        seconds = index * step
        x = LABEL_WIDTH + seconds * scale
        out.append(
            f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{AXIS_HEIGHT - 6}" '
            f'y2="{height - 4}"/>'
            f'<text class="tick" x="{x:.1f}" y="{AXIS_HEIGHT - 10}">'
            f"{escape(_clock(seconds))}</text>"
        )
    out.append(
        f'<text class="axis-name" x="{LABEL_WIDTH - 20}" y="{AXIS_HEIGHT - 10}">since start</text>'
    )
    out.append("</g>")
    return "".join(out)


def _tick_step(span: float) -> float:
    """A 1-2-5 step that cuts the span into about eight to twelve ticks."""
    raw = span / 10
    power = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if raw <= factor * power:
            return float(factor * power)
    return float(10 * power)


def _row(
    label: str, y: float, bars: Sequence[_Bar], scale: float, platform: str, device: int | None
) -> str:
    middle = y + ROW_HEIGHT / 2
    out = [
        f'<text class="row-label" x="{LABEL_WIDTH - 8}" y="{middle + 4:.1f}">'
        f"{escape(label)}</text>",
        f'<rect class="track" x="{LABEL_WIDTH}" y="{y + 2:.1f}" width="{PLOT_WIDTH}" '
        f'height="{ROW_HEIGHT - 4}"/>',
    ]
    for bar in bars:
        where = "" if device is None else f' data-device="{device}"'
        top = middle - BAR_HEIGHT / 2
        startup = (bar.test_begin - bar.begin) * scale
        if startup >= 1:  # start-up drawn apart: thin and grey, under the test's own bar
            out.append(
                f'<rect class="startup"{where} data-nodeid="{escape(bar.run.nodeid)}" '
                f'x="{LABEL_WIDTH + bar.begin * scale:.2f}" y="{top + BAR_HEIGHT / 3:.1f}" '
                f'width="{startup:.2f}" height="{BAR_HEIGHT / 3:.1f}">'
                f"<title>{escape(bar.run.nodeid)}: start-up "
                f"{escape(duration(bar.test_begin - bar.begin))}</title></rect>"
            )
        x = LABEL_WIDTH + bar.test_begin * scale
        width = max((bar.finish - bar.test_begin) * scale, MIN_BAR_WIDTH)
        out.append(
            f'<a href="#test-{bar.index}"><rect class="bar outcome-{escape(bar.outcome)}"{where} '
            f'data-nodeid="{escape(bar.run.nodeid)}" data-attempt="{bar.run.attempt}" '
            f'data-outcome="{escape(bar.outcome)}" x="{x:.2f}" '
            f'y="{top:.1f}" width="{width:.2f}" height="{BAR_HEIGHT}">'
            f"<title>{escape(_tooltip(bar, platform))}</title></rect></a>"
        )
    return "\n".join(out)


def _tooltip(bar: _Bar, platform: str) -> str:
    run = bar.run
    devices = f"{platform}:{format_ids(_ints(run.devices))}" if run.devices else "cpu"
    took = duration(bar.finish - bar.test_begin)
    if bar.outcome == UNFINISHED:
        took += " (still running when the run was cut)"
    lines = [
        run.nodeid,
        f"devices: {devices}",
        f"duration: {took}",
        f"start-up: {duration(bar.test_begin - bar.begin)}",
        f"queue wait: {duration(run.queue_wait)}",
        f"attempt: {run.attempt}",
        f"outcome: {bar.outcome}",
        f"started: +{duration(bar.begin)}",
    ]
    if run.ports:
        lines.append("ports: " + ",".join(str(port) for port in run.ports))
    if run.resources:
        lines.append("resources: " + ", ".join(f"{n}={k}" for n, k in run.resources.items()))
    if run.host:
        lines.append(f"host: {run.host}")
    if run.detail:
        lines.append(f"detail: {run.detail}")
    return "\n".join(lines)


# ---- formatting ----------------------------------------------------------------------------


def _clock(seconds: float) -> str:
    """Axis labels: '2.5 s' under two minutes, then 'm:ss', then 'h:mm:ss'."""
    if seconds < 120:
        return f"{seconds:g} s"
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _outcome_css() -> str:
    rules = []
    for name, color in OUTCOME_COLORS.items():
        rules.append(
            f".bar.outcome-{name},.swatch.outcome-{name}{{fill:{color};background:{color}}}"
        )
        rules.append(f".count.outcome-{name}{{border-color:{color}}}")
    return "".join(rules)


_CSS = (
    "body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;color:#1f2328;"
    "margin:16px 24px;background:#fff}"
    "h1{font-size:20px;margin:0 0 6px}h2{font-size:16px;margin:18px 0 6px}"
    ".facts{display:grid;grid-template-columns:max-content auto;gap:2px 12px;margin:0}"
    ".facts dt{color:#656d76}.facts dd{margin:0}"
    ".status{margin:8px 0;padding:6px 10px;border-radius:4px}"
    ".finished{background:#dafbe1}.failing{background:#ffebe9}"
    ".cut{background:#ffebe9;font-weight:600}"
    ".damage{background:#fff8c5}"
    ".count{display:inline-block;border-left:10px solid #ccc;padding:1px 8px;margin:2px 4px 2px 0;"
    "background:#f6f8fa;border-radius:3px}"
    ".legend .key{margin-right:14px;white-space:nowrap}"
    ".swatch{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-1px;"
    "border-radius:2px}"
    "svg text{font:12px system-ui,sans-serif;fill:#1f2328}"
    ".row-label,.axis-name{text-anchor:end}.axis-name{fill:#656d76}"
    ".tick{text-anchor:middle;fill:#656d76}.grid{stroke:#d8dee4;stroke-width:1}"
    ".track{fill:#f3f4f6}"
    ".timeline,.memory{overflow-x:auto}"  # a narrow window scrolls the chart, not the page
    ".bar{fill:#57606a;stroke:#fff;stroke-width:0.5}.bar:hover{stroke:#1f2328;stroke-width:1.5}"
    ".bar.outcome-running{stroke:#0969da;stroke-dasharray:3 2}"
    f".startup,.swatch.startup{{fill:{STARTUP_COLOR};background:{STARTUP_COLOR}}}"
    f".count.outcome-{NOT_RUN}{{border-color:#1f2328}}"
    "tr:target{background:#fff8c5}"
    "table{border-collapse:collapse;width:100%}"
    "th,td{text-align:left;vertical-align:top;padding:4px 8px;border-bottom:1px solid #d8dee4}"
    ".nodeid{font-family:ui-monospace,monospace;overflow-wrap:anywhere}"
    "td.nodeid{min-width:16em}td.log{max-width:28em;overflow-wrap:anywhere}"
    "tr.leak.loud td{color:#a40e26;font-weight:600}"
    "pre.tail{margin:0;max-height:24em;overflow:auto;background:#f6f8fa;padding:8px;"
    "font:12px/1.35 ui-monospace,monospace;white-space:pre-wrap;word-break:break-all}"
) + _outcome_css()
