"""`devpool capacity --suggest-memory`: a device_memory declaration per test from its peaks.

A suggestion is the highest peak of the test's last watched runs (history/durations.py keeps the
most memory the test held on any one of its devices) × 1.25, rounded up to a size people write:
to the next 256 MiB below 4 GiB, to the next whole GiB from 4 GiB on. A peak is recorded
only where the run watched the test's memory: the test declares device_memory (or falls
under [tool.devpool] device-memory) on a platform whose device memory is known, and the
watch sees it through NVML on cuda or through $DEVPOOL_SIM_MEMORY_FILE on sim.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from devpool.capacity.report import CollectedTest
from devpool.devices.sizes import format_size

SUGGEST_SCHEMA = "devpool-memory-suggestions/1"
HEADROOM = 1.25
MiB, GiB = 2**20, 2**30
FINE_STEP, FINE_BELOW = 256 * MiB, 4 * GiB
ROUNDING = "peak × 1.25, rounded up to the next 256 MiB below 4 GiB and to the next GiB above"
NO_PEAK_REASON = (
    "a peak is recorded only for a test that declares device_memory (or falls under "
    "[tool.devpool] device-memory) on a platform whose memory is known: run it on cuda "
    "where NVML can be read, or on sim have the test write what it uses to "
    "$DEVPOOL_SIM_MEMORY_FILE"
)


def suggested_size(peak: int) -> int:
    """Bytes to declare for a test that peaked at `peak` bytes: peak × 1.25, rounded up."""
    wanted = math.ceil(peak * HEADROOM)
    step = FINE_STEP if wanted < FINE_BELOW else GiB
    return max(math.ceil(wanted / step), 1) * step


def size_text(size: int) -> str:
    """A suggested size as a marker argument: '768MiB', '1.25GiB', '6GiB' (exact, parses back)."""
    if size < GiB:
        return f"{size // MiB}MiB"
    return f"{size / GiB:.2f}".rstrip("0").rstrip(".") + "GiB"


@dataclass(frozen=True)
class Suggestion:
    """One test's recorded peaks and the declaration they suggest."""

    nodeid: str
    runs: int  # watched results the peak is taken over
    peak: int  # bytes
    declared: int | None  # what the test declares now (bytes per device), None: whole devices

    @property
    def size(self) -> int:
        return suggested_size(self.peak)

    @property
    def marker(self) -> str:
        return f'@pytest.mark.device_memory("{size_text(self.size)}")'


@dataclass(frozen=True)
class Suggestions:
    """Every suggestion for the collected tests, and how many device tests had no peak."""

    rows: list[Suggestion]
    without_peak: int


def suggest(
    tests: Sequence[CollectedTest],
    peaks: Mapping[str, tuple[int, int]],
    platform: str,
    kind: str | None = None,
) -> Suggestions:
    """A suggestion for each collected test with peaks (history.History.peaks()), by node id.

    Tests that do not run on this platform or are disabled are left out, as in the report.
    """
    admitted = {platform, kind or platform}
    rows, without = [], 0
    for test in tests:
        if test.platforms is not None and not admitted & set(test.platforms):
            continue
        if test.disabled or test.device_count == 0:
            continue
        seen = peaks.get(test.nodeid)
        if seen is None:
            without += 1
            continue
        rows.append(Suggestion(test.nodeid, seen[0], seen[1], test.device_memory))
    rows.sort(key=lambda s: s.nodeid)
    return Suggestions(rows, without)


def _declared(size: int | None) -> str:
    return "whole" if size is None else format_size(size)


def render_text(found: Suggestions) -> str:
    """The suggestions as a table for a terminal."""
    lines = [f"devpool capacity --suggest-memory: {ROUNDING}", ""]
    if found.rows:
        table = [("test", "runs", "peak", "declared", "suggestion")]
        table += [
            (s.nodeid, str(s.runs), format_size(s.peak), _declared(s.declared), s.marker)
            for s in found.rows
        ]
        widths = [max(len(row[i]) for row in table) for i in range(5)]
        for number, row in enumerate(table):
            cells = [row[0].ljust(widths[0])]
            cells += [cell.rjust(width) for cell, width in zip(row[1:4], widths[1:4], strict=True)]
            lines.append("  " + "  ".join([*cells, row[4]]).rstrip())
            if number == 0:
                lines.append("  " + "-" * (sum(widths) + 8))
    else:
        lines.append("  no test has a recorded peak yet")
    if found.without_peak:
        plural = "s have" if found.without_peak != 1 else " has"
        lines += [
            "",
            f"{found.without_peak} device test{plural} no recorded peak: {NO_PEAK_REASON}",
        ]
    return "\n".join(lines) + "\n"


def render_markdown(found: Suggestions) -> str:
    """The suggestions as a Markdown table (for GITHUB_STEP_SUMMARY)."""
    lines = [f"## devpool: suggested device_memory ({len(found.rows)} tests)", "", ROUNDING, ""]
    if found.rows:
        lines += [
            "| test | runs | peak | declared | suggestion |",
            "| --- | ---: | ---: | ---: | --- |",
        ]
        lines += [
            f"| `{s.nodeid.replace('|', chr(92) + '|')}` | {s.runs} | {format_size(s.peak)} "
            f"| {_declared(s.declared)} | `{s.marker}` |"
            for s in found.rows
        ]
    if found.without_peak:
        lines += ["", f"{found.without_peak} device tests have no recorded peak: {NO_PEAK_REASON}"]
    return "\n".join(lines) + "\n"


def to_json(found: Suggestions) -> dict[str, Any]:
    """The suggestions as data, with "schema": SUGGEST_SCHEMA."""
    return {
        "schema": SUGGEST_SCHEMA,
        "rounding": ROUNDING,
        "suggestions": [
            {
                "nodeid": s.nodeid,
                "runs": s.runs,
                "peak_bytes": s.peak,
                "declared_bytes": s.declared,
                "suggested_bytes": s.size,
                "suggested": size_text(s.size),
                "marker": s.marker,
            }
            for s in found.rows
        ],
        "without_peak": found.without_peak,
        "without_peak_reason": NO_PEAK_REASON,
    }


def render_json(found: Suggestions) -> str:
    return json.dumps(to_json(found), indent=2, ensure_ascii=False) + "\n"
