"""The capacity report as text, Markdown and JSON."""

from __future__ import annotations

import html
import json
from dataclasses import asdict
from typing import Any

from devpool.capacity.costs import DRIFT_SHOWN, CapacityReport, OnceRow, Row
from devpool.wording import counted, duration

CAPACITY_SCHEMA = "devpool-capacity/1"


def _header(rep: CapacityReport) -> list[str]:
    total = rep.totals
    classes = ", ".join(
        f"{name} ({counted(count, 'device')})" for name, count in rep.runner_classes.items()
    )
    return [
        f"{counted(total.total, 'test')} collected; platform {rep.platform}; "
        f"runner classes: {classes}",
        f"estimates: {rep.from_history} from history, {rep.at_default} at the default "
        f"{rep.default_estimate:g} s; wall = on one runner of "
        f"{counted(rep.devices_per_runner, 'device')}",
        _fixed_line(rep),
        DEVICE_SECONDS,
    ]


def _fixed_line(rep: CapacityReport) -> str:
    if not rep.fixed_runs:
        return "start-up and fixed costs: none measured yet (the history has no run of this size)"
    return (
        f"total wall includes {rep.fixed_seconds:.1f} s of start-up and fixed costs "
        f"(median over the last {counted(rep.fixed_runs, 'run')} of this size)"
    )


# What device-s counts here, and how `devpool shard` counts differently (same suite, two sums).
DEVICE_SECONDS = (
    "device-s = devices x estimate, whole devices even for a device_memory test; "
    "devpool shard counts such a test's share of each device and a CPU test's seconds"
)
_COLUMNS = ("devices", "enabled", "quarantined", "disabled", "other platform", "device-s", "wall")
_MEMORY_COLUMN = "memory GiB-s"  # shown when some test declares device_memory


def _columns(rep: CapacityReport) -> list[str]:
    memory = [_MEMORY_COLUMN] if rep.totals.memory_seconds else []
    return [*_COLUMNS[:6], *memory, _COLUMNS[6]]


def _cells(row: Row, memory: bool = False) -> list[str]:
    cells = [
        row.label,
        str(row.enabled),
        str(row.quarantined),
        str(row.disabled),
        str(row.skipped_by_platform),
        f"{row.device_seconds:,.1f}",
        duration(row.wall),
    ]
    if memory:
        cells.insert(6, f"{row.memory_seconds / 2**30:,.1f}")
    return cells


def render_text(rep: CapacityReport) -> str:
    """The report for a terminal."""
    lines = ["devpool capacity", *("  " + line for line in _header(rep)), ""]
    columns = _columns(rep)
    memory = len(columns) > len(_COLUMNS)
    table = [columns, *(_cells(r, memory) for r in rep.rows), _cells(rep.totals, memory)]
    widths = [max(len(cells[i]) for cells in table) for i in range(len(columns))]
    for number, cells in enumerate(table):
        first = cells[0].ljust(widths[0])
        rest = [cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True)]
        lines.append("  " + "  ".join([first, *rest]).rstrip())
        if number == 0 or number == len(table) - 2:
            lines.append("  " + "-" * (sum(widths) + 2 * (len(widths) - 1)))
    if rep.resource_seconds:
        held = ", ".join(f"{n} {duration(s)}" for n, s in rep.resource_seconds.items())
        lines += ["", f"resource-seconds (units × seconds): {held}"]
    if rep.onces:
        lines += ["", ONCE_TITLE]
        lines += [f"  {_once_line(once)}" for once in rep.onces]
    if rep.skipped_by_platform:
        lines += [
            "",
            f"skipped by platform (not on {rep.platform}): {len(rep.skipped_by_platform)}",
        ]
        lines += [f"  {nodeid}" for nodeid in rep.skipped_by_platform]
    if rep.cannot_run_anywhere:
        lines += ["", f"cannot run anywhere: {len(rep.cannot_run_anywhere)}"]
        lines += [f"  {u.nodeid} [{u.request}]: {u.reason}" for u in rep.cannot_run_anywhere]
    if rep.drift:
        lines += ["", f"drift (p90 moved more than {rep.drift_factor:g}x): {len(rep.drift)}"]
        lines += [
            f"  {d.factor:6.1f}x  {duration(d.previous)} -> {duration(d.latest)}  {d.nodeid}"
            for d in rep.drift[:DRIFT_SHOWN]
        ]
        if len(rep.drift) > DRIFT_SHOWN:
            lines.append(f"  … and {len(rep.drift) - DRIFT_SHOWN} more (see --format json)")
    if rep.timeline is not None:
        lines += ["", "timeline (estimated makespan under devpool's backfill scheduler):"]
        for t in rep.timeline:
            extra = f"  ({counted(t.too_big, 'test')} need more devices)" if t.too_big else ""
            lines.append(f"  {t.devices:>4} devices  {duration(t.makespan):>9}{extra}")
    return "\n".join(lines) + "\n"


ONCE_TITLE = "once-fixtures (their lease, in the total's device-s and wall):"


def _once_line(once: OnceRow) -> str:
    """`server: 1 device held 41.0 s (history), 40.0 device-s; 12 tests use it`."""
    lease = counted(once.device_count, "device") if once.device_count else "a CPU slot"
    where = "history" if once.from_history else "estimated: setup at the default + its tests"
    return (
        f"{once.name}: {lease} held {duration(once.held)} ({where}), "
        f"{once.device_seconds:,.1f} device-s; {counted(once.users, 'test')} use it"
    )


def _md(text: str) -> str:
    return html.escape(text, quote=False).replace("|", "\\|")


def render_markdown(rep: CapacityReport) -> str:
    """The report for GITHUB_STEP_SUMMARY: a table, then collapsible sections."""
    total = rep.totals
    lines = [
        f"## devpool capacity: {total.enabled + total.quarantined} of {total.total} tests run "
        f"on {_md(rep.platform)}",
        "",
        *(_md(line) + "  " for line in _header(rep)),
        "",
        "| " + " | ".join(_columns(rep)) + " |",
        "| --- |" + " ---: |" * (len(_columns(rep)) - 1),
    ]
    memory = bool(total.memory_seconds)
    lines += ["| " + " | ".join(_md(c) for c in _cells(r, memory)) + " |" for r in rep.rows]
    lines += ["| " + " | ".join(f"**{_md(c)}**" for c in _cells(total, memory)) + " |", ""]

    def section(title: str, body: list[str], open_: bool = False) -> None:
        lines.extend([f"<details{' open' if open_ else ''}><summary>{title}</summary>", ""])
        lines.extend(body)
        lines.extend(["", "</details>", ""])

    if rep.onces:
        lines += [_md(ONCE_TITLE), "", *(f"- {_md(_once_line(once))}" for once in rep.onces), ""]
    if rep.cannot_run_anywhere:
        section(
            f"<b>Cannot run anywhere: {len(rep.cannot_run_anywhere)}</b>",
            [
                f"- `{_md(u.nodeid)}` [{_md(u.request)}]: {_md(u.reason)}"
                for u in rep.cannot_run_anywhere
            ],
            open_=True,
        )
    if rep.skipped_by_platform:
        section(
            f"Skipped by platform (not on {_md(rep.platform)}): {len(rep.skipped_by_platform)}",
            [f"- `{_md(nodeid)}`" for nodeid in rep.skipped_by_platform],
        )
    if rep.drift:
        body = ["| factor | previous p90 | latest p90 | test |", "| ---: | ---: | ---: | --- |"]
        body += [
            f"| {d.factor:.1f}× | {duration(d.previous)} | {duration(d.latest)} "
            f"| `{_md(d.nodeid)}` |"
            for d in rep.drift[:DRIFT_SHOWN]
        ]
        if len(rep.drift) > DRIFT_SHOWN:
            body += ["", f"… and {len(rep.drift) - DRIFT_SHOWN} more."]
        section(f"Drift (p90 moved more than {rep.drift_factor:g}×): {len(rep.drift)}", body)
    if rep.timeline is not None:
        body = ["| devices | estimated makespan | tests that need more |", "| ---: | ---: | ---: |"]
        body += [f"| {t.devices} | {duration(t.makespan)} | {t.too_big} |" for t in rep.timeline]
        section("Timeline: estimated makespan by pool size", body, open_=True)
    return "\n".join(lines).rstrip("\n") + "\n"


def to_json(rep: CapacityReport) -> dict[str, Any]:
    """The report as data, with "schema": CAPACITY_SCHEMA."""

    def row(r: Row) -> dict[str, Any]:
        return {
            "label": r.label,
            "device_count": r.device_count,
            "nodes": r.nodes,
            "tests": r.total,
            "enabled": r.enabled,
            "quarantined": r.quarantined,
            "disabled": r.disabled,
            "skipped_by_platform": r.skipped_by_platform,
            "device_seconds": round(r.device_seconds, 3),
            "device_memory_gib_seconds": round(r.memory_seconds / 2**30, 3),
            "test_seconds": round(r.test_seconds, 3),
            "wall_seconds": round(r.wall, 3),
        }

    return {
        "schema": CAPACITY_SCHEMA,
        "platform": rep.platform,
        "devices_per_runner": rep.devices_per_runner,
        "runner_classes": rep.runner_classes,
        "default_estimate": rep.default_estimate,
        "estimates_from_history": rep.from_history,
        "estimates_at_default": rep.at_default,
        "rows": [row(r) for r in rep.rows],
        "totals": row(rep.totals),
        "skipped_by_platform": rep.skipped_by_platform,
        "cannot_run_anywhere": [asdict(u) for u in rep.cannot_run_anywhere],
        "drift_factor": rep.drift_factor,
        "drift": [{**asdict(d), "factor": round(d.factor, 3)} for d in rep.drift],
        "timeline": None if rep.timeline is None else [asdict(t) for t in rep.timeline],
        "resource_seconds": {n: round(v, 3) for n, v in rep.resource_seconds.items()},
        "fixed_seconds": round(rep.fixed_seconds, 3),
        "fixed_runs": rep.fixed_runs,
        "once": [
            {**asdict(once), "held": round(once.held, 3)}
            | {"device_seconds": round(once.device_seconds, 3)}
            for once in rep.onces
        ],
    }


def render_json(rep: CapacityReport) -> str:
    return json.dumps(to_json(rep), indent=2, ensure_ascii=False) + "\n"
