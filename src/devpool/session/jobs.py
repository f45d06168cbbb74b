"""Collected items → Jobs: one per test and repetition, the session's defaults on its request.

Then the run's plan of them, fitted to what the backend can place, and the plan as
--devpool-plan prints it, instead of running it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pytest

from devpool.backends import Backend
from devpool.config import Settings
from devpool.devices import memory as devices_memory
from devpool.devices.inventory import Inventory
from devpool.plan import chains
from devpool.plan.jobs import Job, Plan, build_plan, cpu_slots_of
from devpool.plan.markers import Request, request_for


def jobs_for(
    items: list[pytest.Item],
    requests: Mapping[str, Request],
    settings: Settings,
    failed_before: set[str],
) -> list[Job]:
    """The jobs of the collected items, in their order; --devpool-repeat makes n of each."""
    jobs = []
    for index, item in enumerate(items):
        request = requests.get(item.nodeid) or request_for(
            item, settings.platforms, settings.device_memory, settings.resources
        )
        if request.nodes > 1 and not request.isolate:
            # A multi-node test's ranks serve that test alone: never batched nor reused.
            request = replace(request, isolate=True)
        if request.timeout is None and settings.test_timeout is not None:
            request = replace(request, timeout=settings.test_timeout)
        repeat = settings.repeat
        uses: dict[int, int] = {}  # shared by the repeats: spread them over the devices
        for turn in range(1, repeat + 1):
            display = item.nodeid if repeat == 1 else repeat_id(item.nodeid, turn, repeat)
            jobs.append(
                Job(
                    index * repeat + turn - 1,
                    item.nodeid,
                    item.location,
                    request,
                    index,
                    display=display,
                    device_uses=uses,
                    failed_before=item.nodeid in failed_before,
                )
            )
    return jobs


def plan_run(
    planned: list[Job],
    items: Mapping[str, pytest.Item],
    inventory: Inventory,
    settings: Settings,
    estimates: Mapping[str, float],
) -> tuple[Plan, dict[int, int]]:
    """The run's plan of its jobs (a chain of tests tied whole), each with its estimated
    duration from the history (else the default estimate); and the bytes each device hands
    out to device_memory tests ({}: none)."""
    default = settings.default_estimate
    if settings.repeat == 1:  # a queue claims a chain whole (queue/claims.py)
        chains.tie(planned, items)  # a chain's tests then share whole devices
    memory: dict[int, int] = {}
    if settings.backend == "local" and any(j.request.device_memory for j in planned):
        memory = devices_memory.capacity_of(inventory, settings.memory_reserve)
    plan = build_plan(
        planned,
        inventory,
        backend=settings.backend,
        estimate=lambda job: estimates.get(job.nodeid, default),
        memory=memory,
        resources=settings.resources,
        keep_master_port=settings.keep_master_port,
        cpu_slots=settings.cpu_slots,
    )
    return plan, memory


def fit_plan(
    plan: Plan,
    backend: Backend,
    settings: Settings,
    estimates: Mapping[str, float],
    cpu_loads: Mapping[str, float],
) -> None:
    """The plan as the backend runs it: what its cluster can never place is unsatisfiable,
    and each job gets the cores its history says it keeps busy."""
    for job in list(plan.jobs):  # a cluster's real shape: nodes, devices per node
        reason = backend.unsatisfiable(job.request)
        if reason is not None:
            plan.jobs.remove(job)
            plan.unsatisfiable.append((job, reason))
    for job in plan.jobs:
        job.estimate_known = job.nodeid in estimates
        load = cpu_loads.get(job.nodeid)
        if load is not None and job.devices_needed and settings.backend == "local":
            job.cpu_cores = cpu_slots_of(load, settings.cpu_slots)
        if job.request.cpu_ranks:  # a CPU-only ranks(n) test: a core per rank, at most all
            job.cpu_cores = min(job.request.cpu_ranks, settings.cpu_slots)


def repeat_id(nodeid: str, turn: int, total: int) -> str:
    """pytest-repeat's spelling: test_a[3-20], test_b[x-3-20]."""
    if nodeid.endswith("]"):
        return f"{nodeid[:-1]}-{turn}-{total}]"
    return f"{nodeid}[{turn}-{total}]"


def failed_before(config: pytest.Config) -> set[str]:
    """Node ids that failed last time, when --ff or --lf asks for failures first."""
    option = config.option
    cache = getattr(config, "cache", None)
    if cache is None or not (getattr(option, "lf", False) or getattr(option, "failedfirst", False)):
        return set()
    lastfailed = cache.get("cache/lastfailed", {})
    return set(lastfailed) if isinstance(lastfailed, dict) else set()


def print_plan(config: pytest.Config, plan: Plan, inventory: Inventory, settings: Settings) -> None:
    """--devpool-plan: the jobs in the order they would start, and those that cannot."""
    terminal = config.pluginmanager.get_plugin("terminalreporter")
    write = terminal.write_line if terminal is not None else print
    write(f"devpool plan: {len(plan.jobs)} jobs on {inventory.describe()}")
    for order, job in enumerate(plan.jobs, 1):
        write(f"{order:5}  {_planned(job.request):28}  {job.nodeid}")
    for job, reason in plan.unsatisfiable:
        action = "skip" if settings.skip_unsatisfiable else "fail"
        write(f"{action:>5}  {_planned(job.request):28}  {job.nodeid}: {reason}")


def _planned(request: Request) -> str:
    """Its request, with the port a test of two devices or more gets without asking."""
    shown = request.describe()
    if request.ports_needed and not request.ports:
        shown += ", 1 port (auto)"
    return shown
