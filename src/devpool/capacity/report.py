"""What a suite costs in devices: collect it (run nothing), count its requests, estimate time.

Every collected test falls in exactly one state, in this order:
  skipped by platform  its platforms marker leaves out the platform of the report;
  disabled             a skip marker, or a skipif marker whose condition is true;
  quarantined          a quarantine marker: it runs, but does not gate;
  enabled              everything else.
Costs and times count the tests that run (enabled and quarantined). A test costs
device_count × nodes × estimate device-seconds; a device_memory test also costs its
declared memory × device_count × nodes × estimate device-memory-seconds (GiB-s). A row's
wall time on a runner of D devices is a lower bound: max(device-seconds / D, CPU seconds / D,
its longest test), since CPU tests run in CPU slots beside the device tests (a runner is
assumed to have a core per device).
The timeline (optional) simulates devpool's own scheduler instead.
"""

from __future__ import annotations

import contextlib
import html
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

from devpool.config import add_options, read_table, settings_from
from devpool.devices.inventory import Platform, load_platforms
from devpool.errors import DevpoolError
from devpool.history.quarantine import (
    Entry,
    entries_from_file,
    entries_from_table,
    entry_from_marker,
)
from devpool.plan.markers import MARKERS, Request, request_for
from devpool.wording import counted

CAPACITY_SCHEMA = "devpool-capacity/1"
DRIFT_SHOWN = 20  # drift rows shown in text and Markdown; JSON has them all


@dataclass
class CollectedTest:
    """One collected test's request and state, read from its markers."""

    nodeid: str
    device_count: int
    nodes: int
    platforms: tuple[str, ...] | None
    quarantined: bool
    disabled: bool
    device_memory: int | None = None  # bytes per device, declared or the suite's default

    @property
    def request(self) -> Request:
        return Request(
            self.device_count, self.platforms, self.nodes, device_memory=self.device_memory
        )


@dataclass
class Collection:
    """What collect() saw: the tests, the project's platforms and its [tool.devpool] table."""

    tests: list[CollectedTest] = field(default_factory=list)
    platforms: dict[str, Platform] = field(default_factory=dict)
    table: dict[str, Any] = field(default_factory=dict)
    quarantine: list[Entry] = field(default_factory=list)  # [tool.devpool.quarantine] + file
    devices: str | None = None  # --devices after `--`, else [tool.devpool] devices (profile)
    device_memory: int | None = None  # [tool.devpool] device-memory (profile)
    memory_reserve: float = 0.05  # [tool.devpool] memory-reserve (profile)
    error: DevpoolError | None = None


def _pyproject(config: pytest.Config) -> Path:
    if config.inipath is not None and config.inipath.name == "pyproject.toml":
        return config.inipath
    return config.rootpath / "pyproject.toml"


def _disabled(item: pytest.Item) -> bool:
    from _pytest.skipping import evaluate_skip_marks

    try:
        return evaluate_skip_marks(item) is not None
    except (Exception, pytest.fail.Exception) as exc:
        raise DevpoolError(
            f"{item.nodeid}: cannot evaluate its skip/skipif marker: {exc}"
        ) from None


class _Collector:
    """A pytest plugin that reads each collected item's markers and keeps nothing else."""

    def __init__(self) -> None:
        self.seen = Collection()

    def pytest_addoption(self, parser: pytest.Parser) -> None:
        # devpool's own plugin is off while collecting, yet `-- PATHS --devices sim:0-7
        # --devpool-…` must parse as in a run: they are read, and nothing starts.
        add_options(parser)

    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config: pytest.Config) -> None:
        for text in MARKERS.values():
            config.addinivalue_line("markers", text)
        pyproject = _pyproject(config)
        try:
            table = read_table(pyproject)
            settings = settings_from(vars(config.option), table, str(pyproject))
            self.seen.devices = settings.devices
            self.seen.device_memory = settings.device_memory
            self.seen.memory_reserve = settings.memory_reserve
            for key in ("platforms", "quarantine"):
                if not isinstance(table.get(key, {}), dict):
                    raise DevpoolError(f"{pyproject}: [tool.devpool] {key} must be a table")
            self.seen.table = table
            self.seen.platforms = load_platforms(table.get("platforms"))
            self.seen.quarantine = entries_from_table(
                table.get("quarantine", {}), "[tool.devpool.quarantine]"
            )
            file = table.get("quarantine-file")
            if isinstance(file, str) and file:
                path = Path(file).expanduser()
                self.seen.quarantine += entries_from_file(
                    path if path.is_absolute() else config.rootpath / path
                )
        except DevpoolError as exc:
            self.seen.error = exc

    @pytest.hookimpl(trylast=True)  # after -k/-m and other plugins have deselected
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        if self.seen.error is not None:
            return
        try:
            for item in items:
                request = request_for(item, self.seen.platforms, self.seen.device_memory)
                self.seen.tests.append(
                    CollectedTest(
                        item.nodeid,
                        request.device_count,
                        request.nodes,
                        request.platforms,
                        quarantined=entry_from_marker(item) is not None,
                        disabled=_disabled(item),
                        device_memory=request.device_memory,
                    )
                )
        except DevpoolError as exc:
            self.seen.error = exc


def collect_suite(args: Sequence[str]) -> Collection:
    """Collect with pytest in this process (devpool's own plugin off) and read every marker."""
    collector = _Collector()
    out = io.StringIO()
    argv = ["--collect-only", "-q", "-p", "no:devpool", *args]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = pytest.main(argv, plugins=[collector])
    if collector.seen.error is not None:
        raise collector.seen.error
    if code not in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        lines = [line for line in out.getvalue().splitlines() if line.strip()]
        why = next((line for line in lines if line.startswith(("ERROR", "E "))), None)
        why = why or (lines[-1] if lines else f"exit status {int(code)}")
        raise DevpoolError(
            f"pytest could not collect {' '.join(args) or 'the suite'}: {why.strip()} "
            "(run python -m pytest --collect-only to see it all)"
        )
    return collector.seen


def collect(args: Sequence[str]) -> list[CollectedTest]:
    """The suite's tests and their requests, as `pytest --collect-only ARGS` sees them."""
    return collect_suite(args).tests


def apply_quarantine(
    tests: Sequence[CollectedTest], entries: Sequence[Entry], platform: str, kind: str
) -> None:
    """Mark the tests a quarantine table or file entry covers on this platform."""
    for test in tests:
        if not test.quarantined:
            test.quarantined = any(e.covers(test.nodeid, platform, kind) for e in entries)


# --- the report ----------------------------------------------------------------------------


def size_label(device_count: int, nodes: int = 1) -> str:
    """'cpu', '4', or '2 nodes × 4'."""
    each = "cpu" if device_count == 0 else str(device_count)
    return f"{nodes} nodes × {each}" if nodes > 1 else each


@dataclass
class Row:
    """The tests of one request size (devices per node, nodes)."""

    label: str
    device_count: int
    nodes: int
    enabled: int = 0
    skipped_by_platform: int = 0
    quarantined: int = 0
    disabled: int = 0
    device_seconds: float = 0.0  # of the tests that run
    test_seconds: float = 0.0  # of the tests that run
    wall: float = 0.0  # lower bound on one runner of D devices (see the module docstring)
    cpu_seconds: float = 0.0  # of the CPU-only tests that run
    memory_seconds: float = 0.0  # declared device memory × seconds (byte-seconds), that run
    _longest: float = 0.0

    @property
    def total(self) -> int:
        return self.enabled + self.skipped_by_platform + self.quarantined + self.disabled


@dataclass(frozen=True)
class Unrunnable:
    nodeid: str
    request: str
    reason: str


@dataclass(frozen=True)
class Drift:
    nodeid: str
    previous: float
    latest: float

    @property
    def factor(self) -> float:
        low, high = sorted((self.previous, self.latest))
        return high / low


@dataclass(frozen=True)
class TimelineRow:
    devices: int
    makespan: float
    tests: int  # simulated
    too_big: int  # tests needing more devices than this pool


@dataclass
class CapacityReport:
    platform: str
    devices_per_runner: int
    runner_classes: dict[str, int]
    default_estimate: float
    rows: list[Row]
    from_history: int
    at_default: int
    cannot_run_anywhere: list[Unrunnable]
    skipped_by_platform: list[str]
    drift: list[Drift]
    drift_factor: float
    timeline: list[TimelineRow] | None

    @property
    def totals(self) -> Row:
        total = Row("total", 0, 1)
        for row in self.rows:
            total.enabled += row.enabled
            total.skipped_by_platform += row.skipped_by_platform
            total.quarantined += row.quarantined
            total.disabled += row.disabled
            total.device_seconds += row.device_seconds
            total.test_seconds += row.test_seconds
            total.cpu_seconds += row.cpu_seconds
            total.memory_seconds += row.memory_seconds
            total._longest = max(total._longest, row._longest)
        total.wall = _wall(total, self.devices_per_runner)
        return total


def parse_runner_class(text: str) -> tuple[str, int]:
    """'sim-8=8' -> ('sim-8', 8)."""
    name, equals, count = text.partition("=")
    if not equals or not name.strip() or not count.strip().isdecimal() or int(count) < 1:
        raise DevpoolError(
            f"--runner-class {text!r} is not NAME=DEVICES, e.g. cuda-8=8 for runners of 8 devices"
        )
    return name.strip(), int(count)


def report(
    tests: Sequence[CollectedTest],
    platform: str,
    runner_classes: Mapping[str, int] | None,
    estimates: Mapping[str, float],
    default_estimate: float,
    *,
    devices_per_runner: int = 8,
    previous: Mapping[str, float] | None = None,
    drift_factor: float = 2.0,
    timeline: bool = False,
    kind: str | None = None,
) -> CapacityReport:
    """Count and cost the collected tests for one platform on runners of the given classes.

    A platforms marker admits the platform by its name or by its kind, as a run does.
    """
    admitted = {platform, kind or platform}
    classes = dict(runner_classes or {f"{platform}-{devices_per_runner}": devices_per_runner})
    biggest_name, biggest = max(classes.items(), key=lambda c: (c[1], c[0]))
    rows: dict[tuple[int, int], Row] = {}
    unrunnable: list[Unrunnable] = []
    platform_skipped: list[str] = []
    running: list[tuple[CollectedTest, float]] = []
    from_history = 0
    for test in tests:
        key = (test.nodes, test.device_count)
        if key not in rows:
            rows[key] = Row(
                size_label(test.device_count, test.nodes), test.device_count, test.nodes
            )
        row = rows[key]
        if test.platforms is not None and not admitted & set(test.platforms):
            row.skipped_by_platform += 1
            platform_skipped.append(test.nodeid)
            continue
        if test.disabled:
            row.disabled += 1
            continue
        if test.quarantined:
            row.quarantined += 1
        else:
            row.enabled += 1
        estimate = estimates.get(test.nodeid)
        from_history += estimate is not None
        seconds = default_estimate if estimate is None else estimate
        row.test_seconds += seconds
        row.device_seconds += test.device_count * test.nodes * seconds
        if test.device_memory is not None:
            row.memory_seconds += test.device_memory * test.device_count * test.nodes * seconds
        if test.device_count == 0:
            row.cpu_seconds += test.nodes * seconds
        row._longest = max(row._longest, seconds)
        if test.device_count > biggest:
            unrunnable.append(
                Unrunnable(
                    test.nodeid,
                    test.request.describe(),
                    f"needs {test.device_count} {platform} devices per node; the largest "
                    f"runner class, {biggest_name}, has {biggest}",
                )
            )
        else:
            running.append((test, seconds))
    for row in rows.values():
        row.wall = _wall(row, devices_per_runner)
    drift = _drift(tests, estimates, previous or {}, drift_factor)
    return CapacityReport(
        platform=platform,
        devices_per_runner=devices_per_runner,
        runner_classes=classes,
        default_estimate=default_estimate,
        rows=[rows[key] for key in sorted(rows)],
        from_history=from_history,
        at_default=len(running) + len(unrunnable) - from_history,
        cannot_run_anywhere=unrunnable,
        skipped_by_platform=platform_skipped,
        drift=drift,
        drift_factor=drift_factor,
        timeline=_timeline(running, devices_per_runner) if timeline else None,
    )


def _wall(row: Row, devices: int) -> float:
    slots = max(devices, 1)
    return max(row.device_seconds / slots, row.cpu_seconds / slots, row._longest)


def _drift(
    tests: Sequence[CollectedTest],
    latest: Mapping[str, float],
    previous: Mapping[str, float],
    factor: float,
) -> list[Drift]:
    found = [
        Drift(t.nodeid, previous[t.nodeid], latest[t.nodeid])
        for t in tests
        if previous.get(t.nodeid, 0.0) > 0 and latest.get(t.nodeid, 0.0) > 0
    ]
    found = [d for d in found if d.factor > factor]
    found.sort(key=lambda d: (-d.factor, d.nodeid))
    return found


def pool_sizes(devices: int) -> list[int]:
    """1, 2, 4, 8, … up to `devices`, and `devices` itself."""
    sizes, size = [], 1
    while size < devices:
        sizes.append(size)
        size *= 2
    return [*sizes, max(devices, 1)]


def simulate(tests: Sequence[tuple[int, float]], devices: int) -> float:
    """Makespan of (device_count, seconds) tests on `devices` devices under devpool's Backfill.

    Drives devpool.plan.scheduler.Scheduler as the controller does; CPU tests get one slot per
    device (a runner is assumed to have at least one core per device).
    """
    from devpool.plan.jobs import Job
    from devpool.plan.policies import Backfill
    from devpool.plan.scheduler import Scheduler
    from devpool.plan.scheduler import simulate as run_schedule

    slots = max(devices, 1)
    scheduler = Scheduler(
        tuple(range(devices)), Backfill(), max_parallel=2 * slots, cpu_slots=slots
    )
    jobs = [
        Job(index, f"t{index}", ("", None, ""), Request(count), index, estimate=seconds)
        for index, (count, seconds) in enumerate(tests)
    ]
    return run_schedule(scheduler, jobs)


def _timeline(running: Sequence[tuple[CollectedTest, float]], pool: int) -> list[TimelineRow]:
    rows = []
    local = [(t.device_count, s) for t, s in running if t.nodes == 1]
    for devices in pool_sizes(pool):
        fits = [(count, seconds) for count, seconds in local if count <= devices]
        rows.append(
            TimelineRow(devices, simulate(fits, devices), len(fits), len(local) - len(fits))
        )
    return rows


# --- rendering -----------------------------------------------------------------------------


def seconds_text(seconds: float) -> str:
    """12.3 s, 4m 05s, 2h 03m."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    return f"{whole // 3600}h {whole % 3600 // 60:02d}m"


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
        DEVICE_SECONDS,
    ]


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
        seconds_text(row.wall),
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
            f"  {d.factor:6.1f}x  {seconds_text(d.previous)} -> {seconds_text(d.latest)}"
            f"  {d.nodeid}"
            for d in rep.drift[:DRIFT_SHOWN]
        ]
        if len(rep.drift) > DRIFT_SHOWN:
            lines.append(f"  … and {len(rep.drift) - DRIFT_SHOWN} more (see --format json)")
    if rep.timeline is not None:
        lines += ["", "timeline (estimated makespan under devpool's backfill scheduler):"]
        for t in rep.timeline:
            extra = f"  ({counted(t.too_big, 'test')} need more devices)" if t.too_big else ""
            lines.append(f"  {t.devices:>4} devices  {seconds_text(t.makespan):>9}{extra}")
    return "\n".join(lines) + "\n"


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
            f"| {d.factor:.1f}× | {seconds_text(d.previous)} | {seconds_text(d.latest)} "
            f"| `{_md(d.nodeid)}` |"
            for d in rep.drift[:DRIFT_SHOWN]
        ]
        if len(rep.drift) > DRIFT_SHOWN:
            body += ["", f"… and {len(rep.drift) - DRIFT_SHOWN} more."]
        section(f"Drift (p90 moved more than {rep.drift_factor:g}×): {len(rep.drift)}", body)
    if rep.timeline is not None:
        body = ["| devices | estimated makespan | tests that need more |", "| ---: | ---: | ---: |"]
        body += [
            f"| {t.devices} | {seconds_text(t.makespan)} | {t.too_big} |" for t in rep.timeline
        ]
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
    }


def render_json(rep: CapacityReport) -> str:
    return json.dumps(to_json(rep), indent=2, ensure_ascii=False) + "\n"
