"""Collected items → Jobs: the requests, what cannot run here and why, and the start order."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from devpool.devices.inventory import Inventory, format_ids
from devpool.devices.sizes import format_size
from devpool.plan.markers import Request
from devpool.wording import counted

DEFAULT_ESTIMATE = 1.0  # seconds assumed for a test with no duration history
ORDER_GRAIN = 0.1  # seconds: estimates below this do not reorder tests
ORDER_STEP = 2.0  # costs within this factor of each other count as equal when ordering
FAILED_FIRST = 1 << 20  # more cost buckets than any float can span: failures sort first
CPU_BOUND = 0.5  # cores: a device test whose CPU load reaches this takes CPU slots too


@dataclass(eq=False)
class Job:
    """The unit the scheduler places: one test with one resource request."""

    id: int
    nodeid: str
    location: tuple[str, int | None, str]
    request: Request
    index: int  # position in collection order; keeps ties in the order the user wrote tests
    estimate: float = DEFAULT_ESTIMATE
    estimate_known: bool = False  # from duration history, not the default
    attempt: int = 1
    queued_at: float = 0.0
    foreign_wait: float = 0.0  # seconds spent blocked on devices held by other runs
    waited: float = 0.0  # queue wait of the current attempt, from queued to started
    display: str = ""  # the id reports carry: the node id, or with a repeat suffix
    failed_before: bool = False  # failed last run and --ff / --lf: starts before the rest
    ahead: bool = False  # a once-fixture's user: starts before the rest (run/once.py)
    retries_failed: int = 0  # reruns spent on failed/error/timeout attempts
    retries_infra: int = 0  # reruns spent on crashed/infra attempts
    # Attempts that started and then failed, errored, timed out or crashed: only those make
    # a later pass flaky (not a worker that died before the test, nor the memory retry).
    own_failures: int = 0
    runs_alone: bool = False  # sent back untouched too often: next time in a worker of its own
    setbacks: list[str] = field(default_factory=list)  # why it went back without running
    # Tests tied by pytest-order / pytest-dependency markers (plan/chains.py), in order:
    # the first is queued, the rest run after it in its worker.
    chain: tuple[Job, ...] | None = None
    # How often this test (all its repeats) has run on each device: reruns and repeats
    # prefer the devices it has used least, to tell a bad device from a bad test.
    device_uses: dict[int, int] = field(default_factory=dict)
    # CPU slots a device job takes besides its devices: what its history says it keeps
    # busy (cpu_slots_of); a CPU-only job always takes one.
    cpu_cores: int = 0

    def __post_init__(self) -> None:
        if not self.display:
            self.display = self.nodeid

    @property
    def fresh(self) -> bool:
        """It runs in a process of its own: the isolate marker, or a retry (a failure may
        have come from the state an earlier test left in a shared process)."""
        # Explicit ports and named resources too: a warm worker would hold them while idle,
        # and another job's request may differ (the host lease is the worker's, for life).
        host = self.request.ports > 0 or bool(self.request.resources)
        return self.request.isolate or self.attempt > 1 or self.runs_alone or host

    @property
    def devices_needed(self) -> int:
        """Every device the job holds at once: a nodes(n) test holds n × device_count."""
        return self.request.device_count * self.request.nodes

    @property
    def cpu_needed(self) -> int:
        """CPU slots (cores) the job holds while it runs: a CPU-only ranks(n) test one per
        rank, a cpus(n) test n (per rank)."""
        asked = self.request.cpus_total  # cpus(n): n per process
        if self.devices_needed:
            return max(self.cpu_cores, asked)
        # A CPU ranks(n) test: at most every slot (the controller caps cpu_cores).
        return max(self.cpu_cores or self.request.cpu_ranks or 1, asked)

    @property
    def shape(self) -> int:
        """Ranks of a ranks(n) test (0: an ordinary one): a worker runs jobs of one shape."""
        return self.request.ranks

    @property
    def resources_needed(self) -> dict[str, int]:
        """Units of each named host resource the job holds while it runs."""
        return dict(self.request.resources)

    @property
    def memory_needed(self) -> int | None:
        """Bytes on each of its devices, shared with other jobs; None: whole devices."""
        return self.request.device_memory if self.devices_needed else None

    def priority(self) -> tuple[float, int, int]:
        """Sort key, smallest first: last run's failures (--ff, --lf) and the users of a
        once-fixture that is up, then most device-seconds, then the larger request."""
        # Device-seconds within a factor of ORDER_STEP of each other tie, and ties go by
        # request size, then by the order the user wrote the tests in. Near-equal costs
        # thus don't interleave 1-, 2- and 4-device jobs (each switch retires warm workers
        # and starts new ones), and short tests keep their module fixtures warm.
        weight = self.devices_needed or 0.5
        cost = weight * max(self.estimate, ORDER_GRAIN)
        bucket = math.floor(math.log(cost / ORDER_GRAIN, ORDER_STEP))
        # Failures of the last run first (pytest's --ff / --lf), among them the same order.
        first = -bucket - (FAILED_FIRST if self.failed_before or self.ahead else 0)
        return (first, -self.devices_needed, self.index)


def cpu_slots_of(load: float, cpu_slots: int) -> int:
    """CPU slots for a device test that keeps `load` cores busy or waiting: none below
    CPU_BOUND (it waits on its devices), else its load rounded, at most every slot."""
    if load < CPU_BOUND:
        return 0
    return max(1, min(cpu_slots, math.floor(load + 0.5)))


@dataclass
class Plan:
    """Jobs to run in priority order, and the tests that cannot run in this session."""

    jobs: list[Job] = field(default_factory=list)
    unsatisfiable: list[tuple[Job, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # for the header: what the plan changed


def unsatisfiable_reason(
    request: Request,
    inventory: Inventory,
    backend: str,
    memory: Mapping[int, int] | None = None,
    resources: Mapping[str, int] | None = None,
    cpu_slots: int | None = None,
) -> str | None:
    """Why a request can never be met by this session, or None when it can.

    memory: what each device may hand out to device_memory requests (after the reserve).
    resources: the capacity of each named host resource ([tool.devpool.resources]).
    cpu_slots: the run's CPU slots, which a cpus(n) request may not exceed.
    """
    if cpu_slots is not None and request.cpus_total > cpu_slots:
        return cpus_reason(request, cpu_slots)
    for name, count in request.resources:
        capacity = (resources or {}).get(name, 0)
        if count > capacity:
            return (
                f"needs {count} of resource {name}; [tool.devpool.resources] gives it "
                f"capacity {capacity}"
            )
    if request.nodes > 1 and backend == "local":
        n = request.nodes
        per_node = ""
        if request.device_count:
            devices = counted(request.device_count, f"{inventory.platform.name} device")
            per_node = f", {devices} each"
        return (
            f"nodes({n}) needs {n} machines{per_node}; the local backend runs on this one "
            f"(use --devpool-backend ray, or ranks({n}) for {n} processes here)"
        )
    have = len(inventory.devices)
    if request.device_count > 0 and have == 0:
        count = request.device_count
        noun = "device" if count == 1 else "devices"
        return f"needs {count} {noun}; this session has none ({inventory.source})"
    if request.device_count > have:
        return (
            f"needs {request.device_count} {inventory.platform.name} devices; "
            f"the pool has {have} ({inventory.platform.name}:{format_ids(inventory.devices)})"
        )
    if request.device_memory is not None and request.device_count > 0 and memory:
        big = [d for d in inventory.devices if memory.get(d, 0) >= request.device_memory]
        if len(big) < request.device_count:
            most = format_size(max(memory.get(d, 0) for d in inventory.devices))
            name = inventory.platform.name
            return (
                f"needs {request.describe()}; a {name} device hands out at most {most} "
                "(its memory less --devpool-memory-reserve)"
                + (f", and only {len(big)} of them that much" if big else "")
            )
    return None


def cpus_reason(request: Request, cpu_slots: int) -> str:
    """Why a cpus(n) request cannot run: more cores than the run's CPU slots."""
    each = f" ({request.ranks} ranks × {request.cpus})" if request.ranks else ""
    return (
        f"@pytest.mark.cpus({request.cpus}) needs {request.cpus_total} cores{each}; this run has "
        f"{counted(cpu_slots, 'CPU slot')} (the cores this process may use, or "
        "--devpool-cpu-slots)"
    )


def build_plan(
    jobs: Sequence[Job],
    inventory: Inventory,
    backend: str = "local",
    estimate: Callable[[Job], float] | None = None,
    memory: Mapping[int, int] | None = None,
    resources: Mapping[str, int] | None = None,
    keep_master_port: bool = False,
    cpu_slots: int | None = None,
) -> Plan:
    """Split jobs into runnable (sorted by priority) and unsatisfiable ones.

    memory: what each device may hand out (memory.usable_memory); where it is unknown,
    device_memory requests hold whole devices: sharing memory nobody can count is unsafe.
    """
    plan = Plan()
    for job in jobs:
        if estimate is not None:
            job.estimate = estimate(job)
        if job.request.device_memory is not None and not memory:
            job.request = replace(job.request, device_memory=None)
            if not plan.notes:
                # pynvml reads only NVIDIA devices' memory: advice for cuda alone.
                nvml = ", or install pynvml" if inventory.platform.kind == "cuda" else ""
                plan.notes.append(
                    f"device_memory tests hold whole devices: the memory of "
                    f"{inventory.platform.name} devices is unknown (set memory under "
                    f"[tool.devpool.platforms]{nvml})"
                )
        reason = unsatisfiable_reason(job.request, inventory, backend, memory, resources, cpu_slots)
        if reason is None:
            plan.jobs.append(job)
        else:
            plan.unsatisfiable.append((job, reason))
    preset = os.environ.get("MASTER_PORT")
    if preset is not None and any(job.request.ports_needed for job in plan.jobs):
        plan.notes.append(
            f"MASTER_PORT={preset} is set in the environment: kept, as "
            "--devpool-keep-master-port asks (tests side by side on it may collide; their "
            "leased ports are in DEVPOOL_PORTS)"
            if keep_master_port
            else f"MASTER_PORT={preset} is set in the environment: tests that lease ports get "
            "their own leased port in MASTER_PORT instead (keep the caller's with "
            "--devpool-keep-master-port)"
        )
    plan.jobs.sort(key=Job.priority)
    return plan
