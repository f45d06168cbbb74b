"""The HTML report's memory lanes: per device, the memory each memory test held over time.

A lane is drawn under the timeline on the same time axis. Each memory test's attempt is a
band of its declared amount (`memory` on job_end), stacked with the others that held the
device at the same moment; inside it, a darker band shows the peak it really used there
(`memory_peak`), red when it used more than it declared. The lane's height is the device's
capacity when the record gives one (session_start `memory`), else the most ever held.

The RunRecord keeps neither field, so they are read from the record's own job_end lines,
skipping any line that is not JSON (the reader has already said where a record is damaged).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devpool.devices.sizes import format_size
from devpool.report.htmltext import escape

LANE_HEIGHT = 44
LANE_GAP = 6
MIN_BAND = 3.0  # px: a test's band stays readable beside a device's whole capacity
MIN_WIDTH = 2.0


@dataclass(frozen=True)
class Hold:
    """One memory test's attempt on its devices: declared bytes per device and peaks."""

    nodeid: str
    attempt: int
    devices: tuple[int, ...]
    begin: float  # seconds since the axis origin
    finish: float
    declared: int | None  # bytes per device; None: an older record that did not say
    peak: Mapping[int, int] = field(default_factory=dict)  # device → bytes

    def height(self, device: int) -> int:
        """What the band stands for on the device: the declaration, else the peak."""
        return self.declared or self.peak.get(device, 0)


def _int(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _hold(event: Mapping[str, Any], origin: float) -> Hold | None:
    declared = _int(event.get("memory"))
    raw_peak = event.get("memory_peak")
    peak: dict[int, int] = {}
    if isinstance(raw_peak, dict):
        for device, size in raw_peak.items():
            number, amount = _int(device), _int(size)
            if number is not None and amount is not None:
                peak[number] = amount
    if not declared and not peak:
        return None
    start, end = event.get("start"), event.get("end")
    if not isinstance(start, (int, float)) or not isinstance(end, (int, float)):
        return None
    devices = tuple(d for d in (_int(x) for x in event.get("devices") or []) if d is not None)
    return Hold(
        str(event.get("nodeid", "")),
        _int(event.get("attempt")) or 1,
        devices,
        float(start) - origin,
        max(float(end), float(start)) - origin,
        declared or None,
        peak,
    )


def read_holds(path: Path, origin: float) -> list[Hold]:
    """Every memory test's attempt in a run record, from its job_end lines."""
    try:
        lines = path.read_bytes().split(b"\n")
    except OSError:
        return []
    holds = []
    for line in lines:
        if b'"job_end"' not in line:
            continue
        try:
            event = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(event, dict) and event.get("type") == "job_end":
            hold = _hold(event, origin)
            if hold is not None:
                holds.append(hold)
    return holds


def capacities(start: Mapping[str, Any]) -> dict[int, int]:
    """Bytes each device hands out, as session_start's `memory` gives them ({} without)."""
    raw = start.get("memory")
    if not isinstance(raw, dict):
        return {}
    found = {}
    for device, size in raw.items():
        number, amount = _int(device), _int(size)
        if number is not None and amount:
            found[number] = amount
    return found


def _segments(holds: Sequence[Hold]) -> list[tuple[float, float, list[Hold]]]:
    """The lane cut where any hold begins or ends: (begin, end, holds in it, oldest first)."""
    cuts = sorted({h.begin for h in holds} | {h.finish for h in holds})
    ordered = sorted(holds, key=lambda h: (h.begin, h.nodeid, h.attempt))
    segments = []
    for begin, end in zip(cuts, cuts[1:], strict=False):
        inside = [h for h in ordered if h.begin <= begin and h.finish >= end]
        if inside:
            segments.append((begin, end, inside))
    return segments


def lane(
    device: int,
    label: str,
    holds: Sequence[Hold],
    capacity: int | None,
    y: float,
    left: float,
    scale: float,
    plot_width: float,
) -> str:
    """One device's lane as SVG: stacked declared bands, peak bands inside them."""
    segments = _segments(holds)
    most = max((sum(h.height(device) for h in inside) for _, _, inside in segments), default=0)
    top = max(capacity or 0, most, 1)
    unit = (LANE_HEIGHT - 4) / top
    bottom = y + LANE_HEIGHT - 2
    # Two short lines right of the label column's edge: "6 GiB" over "of 80 GiB" fits its
    # width whatever the sizes (one line, "14.2 GiB of 79.6 GiB", ran off the page's left).
    held, scale_note = format_size(most), f"of {format_size(capacity)}" if capacity else "max held"
    out = [
        f'<g class="memory-lane" data-device="{device}" data-capacity="{capacity or ""}" '
        f'data-max-held="{most}">',
        f'<text class="row-label" x="{left - 8}" y="{y + 14:.1f}">{escape(label)}</text>',
        f'<text class="lane-note" x="{left - 8}" y="{y + 27:.1f}">'
        f"<title>{escape(held)} {escape(scale_note)}</title>{escape(held)}</text>",
        f'<text class="lane-note" x="{left - 8}" y="{y + 39:.1f}">{escape(scale_note)}</text>',
        f'<rect class="track" x="{left}" y="{y + 2:.1f}" width="{plot_width:g}" '
        f'height="{LANE_HEIGHT - 4}"/>',
    ]
    tooltips: dict[tuple[str, int], str] = {}
    for begin, end, inside in segments:
        x, width = left + begin * scale, max((end - begin) * scale, MIN_WIDTH)
        level = bottom
        for hold in inside:
            size = hold.height(device)
            peak = hold.peak.get(device)
            key = (hold.nodeid, hold.attempt)
            if key not in tooltips:
                tooltips[key] = _tooltip(hold, device, label)
            data = (
                f'data-nodeid="{escape(hold.nodeid)}" data-attempt="{hold.attempt}" '
                f'data-device="{device}" data-declared="{hold.declared or ""}" '
                f'data-peak="{"" if peak is None else peak}"'
            )
            height = max(size * unit, MIN_BAND) if size else 0.0
            out.append(
                f'<rect class="memory-hold" {data} x="{x:.2f}" y="{level - height:.2f}" '
                f'width="{width:.2f}" height="{height:.2f}"><title>{escape(tooltips[key])}</title>'
                "</rect>"
            )
            if peak is not None and hold.declared:
                over = peak > hold.declared
                used = min(peak, hold.declared) * unit
                kind = "memory-peak over" if over else "memory-peak"
                out.append(
                    f'<rect class="{kind}" {data} x="{x:.2f}" y="{level - used:.2f}" '
                    f'width="{width:.2f}" height="{used:.2f}"><title>{escape(tooltips[key])}'
                    "</title></rect>"
                )
            level -= height
    out.append("</g>")
    return "\n".join(out)


def _tooltip(hold: Hold, device: int, label: str) -> str:
    lines = [hold.nodeid, f"device: {label}"]
    if hold.declared:
        lines.append(f"declared: {format_size(hold.declared)}")
    peak = hold.peak.get(device)
    if peak is not None:
        over = " (more than declared)" if hold.declared and peak > hold.declared else ""
        lines.append(f"peak: {format_size(peak)}{over}")
    lines += [f"held: {hold.finish - hold.begin:.2f} s", f"attempt: {hold.attempt}"]
    return "\n".join(lines)


def memory_section(
    platform: str,
    holds: Sequence[Hold],
    capacity: Mapping[int, int],
    left: float,
    plot_width: float,
    span: float,
) -> str:
    """The "Device memory" section: a lane per device some memory test held; "" for none."""
    devices = sorted({d for h in holds for d in h.devices})
    if not devices:
        return ""
    scale = plot_width / span
    height = len(devices) * (LANE_HEIGHT + LANE_GAP) + 8
    width = left + plot_width + 16
    out = [
        '<section class="memory"><h2>Device memory</h2>',
        '<p class="legend"><span class="key"><i class="swatch memory-hold"></i>declared</span>'
        '<span class="key"><i class="swatch memory-peak"></i>peak used</span>'
        '<span class="key"><i class="swatch memory-peak over"></i>used more than declared'
        "</span></p>",
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height}" '
        f'viewBox="0 0 {width:.0f} {height}" role="img" aria-label="device memory">',
    ]
    y = 4.0
    for device in devices:
        mine = [h for h in holds if device in h.devices]
        label = f"{platform}:{device}"
        out.append(lane(device, label, mine, capacity.get(device), y, left, scale, plot_width))
        y += LANE_HEIGHT + LANE_GAP
    out.append("</svg></section>")
    return "\n".join(out)


CSS = (
    ".memory-hold{fill:#b6e3ff;stroke:#fff;stroke-width:0.4}"
    ".memory-peak{fill:#0969da}.memory-peak.over{fill:#d1242f}"
    ".swatch.memory-hold{background:#b6e3ff}.swatch.memory-peak{background:#0969da}"
    ".swatch.memory-peak.over{background:#d1242f}"
    ".lane-note{text-anchor:end;fill:#656d76;font-size:11px}"
)
