"""What the collected tests cost: rows per device count, wall-time bounds, drift, and the
timeline simulated under devpool's scheduler (see capacity/report.py for the rules)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from devpool.capacity.collect import CollectedTest
from devpool.errors import DevpoolError
from devpool.plan.markers import Request
from devpool.plan.once import OnceFixture, history_id, setup_estimate

DRIFT_FLOOR = 0.05  # seconds: a test this short both times is never listed as drifting
DRIFT_SHOWN = 20  # drift rows shown in text and Markdown; JSON has them all


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


@dataclass(frozen=True)
class OnceRow:
    """A once-fixture ([tool.devpool.once]) its tests need: its lease, held from its setup
    until its last user ended, costs device_count × held seconds (CPU seconds for none)."""

    name: str
    device_count: int
    users: int  # tests that run and use it
    held: float  # seconds: the history's, else its setup at the default estimate + its users
    from_history: bool

    @property
    def device_seconds(self) -> float:
        return self.device_count * self.held


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
    # Named host resources: units × seconds of the tests that run, per resource.
    resource_seconds: dict[str, float] = field(default_factory=dict)
    # What a run costs beyond its tests (start-up, collection, gaps, exit): the median of
    # recent runs' wall against their bound, from the history; in the totals' wall.
    fixed_seconds: float = 0.0
    fixed_runs: int = 0
    onces: list[OnceRow] = field(default_factory=list)

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
        for once in self.onces:  # a lease, not a test: in the seconds, not the counts
            total.device_seconds += once.device_seconds
            total.cpu_seconds += 0.0 if once.device_count else once.held
            total._longest = max(total._longest, once.held)
        total.wall = _wall(total, self.devices_per_runner) + self.fixed_seconds
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
    fixed: tuple[float, int] = (0.0, 0),
    once: Sequence[OnceFixture] = (),
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
    held: dict[str, float] = {}
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
        for name, units in test.resources:
            held[name] = held.get(name, 0.0) + units * seconds
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
    onces = once_rows(once, running, platform, kind or platform, estimates, default_estimate,
                      devices_per_runner)  # fmt: skip
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
        timeline=_timeline(running, devices_per_runner, fixed[0], onces) if timeline else None,
        resource_seconds=dict(sorted(held.items())),
        fixed_seconds=fixed[0],
        fixed_runs=fixed[1],
        onces=onces,
    )


def once_rows(
    fixtures: Sequence[OnceFixture],
    running: Sequence[tuple[CollectedTest, float]],
    platform: str,
    kind: str,
    estimates: Mapping[str, float],
    default_estimate: float,
    devices: int,
) -> list[OnceRow]:
    """A row per once-fixture that a test which runs uses. Without history its lease is held
    for its setup (setup_estimate: the history's, else the default estimate) and for its
    users, run on the devices it leaves."""
    rows = []
    for fixture in fixtures:
        if not fixture.runs_on(platform, kind):
            continue  # an ordinary session fixture there: its tests pay for it
        users = [seconds for test, seconds in running if fixture.name in test.once]
        if not users:
            continue
        count = fixture.request.device_count
        known = estimates.get(history_id(fixture.name))
        held = known
        if held is None:
            setup = setup_estimate(fixture.name, estimates, default_estimate)
            held = setup + max(max(users), sum(users) / max(devices - count, 1))
        rows.append(OnceRow(fixture.name, count, len(users), held, known is not None))
    return rows


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
        # Under DRIFT_FLOOR seconds both times, a change is the clock's noise, not drift.
        if previous.get(t.nodeid, 0.0) > 0
        and latest.get(t.nodeid, 0.0) > 0
        and max(previous[t.nodeid], latest[t.nodeid]) >= DRIFT_FLOOR
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


def _timeline(
    running: Sequence[tuple[CollectedTest, float]],
    pool: int,
    fixed: float = 0.0,
    onces: Sequence[OnceRow] = (),
) -> list[TimelineRow]:
    rows = []
    local = [(t.device_count, s) for t, s in running if t.nodes == 1]
    held = [(once.device_count, once.held) for once in onces]  # its lease: a long job
    for devices in pool_sizes(pool):
        fits = [(count, seconds) for count, seconds in local if count <= devices]
        tests = len(fits)
        fits += [(count, seconds) for count, seconds in held if count < devices]
        makespan = simulate(fits, devices) + fixed
        rows.append(TimelineRow(devices, makespan, tests, len(local) - tests))
    return rows


# --- rendering -----------------------------------------------------------------------------
