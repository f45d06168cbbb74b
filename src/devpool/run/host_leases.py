"""The loop's side of ports and named host resources: take them with a placement's devices.

A placement's ports and resources are taken with its devices in one call into the lock
folder (LockDir.take), all or nothing and without waiting: when another run holds a
resource or the ports run out, nothing is held and the job waits out a short delay in the
loop's ``delayed`` list (no hold-and-wait, so two runs can never deadlock). A job that
waits longer than --devpool-lease-timeout ends ``infra`` naming the holders. A worker holds
its host lease for life; its tests see the ports in ``DEVPOOL_PORTS``, ``MASTER_ADDR`` and
``MASTER_PORT`` (the first port, over the caller's unless --devpool-keep-master-port), for
torch.distributed's rendezvous.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from devpool.devices.leases import Lease
from devpool.devices.ports import overlap_error, ports_env
from devpool.devices.resources import HostBlocked, HostLease
from devpool.plan.jobs import Job
from devpool.plan.scheduler import Scheduler
from devpool.run.attempts import Attempt
from devpool.run.context import RunContext

RESOURCES_ENV = "DEVPOOL_RESOURCES"
# Seconds before a job blocked on another run's ports or resources tries again. Shorter than
# a device retry: a try costs a few non-blocking flocks, and resource holds are often short.
HOST_RETRY = 0.1


class _LoopView(Protocol):
    ctx: RunContext
    scheduler: Scheduler

    attempts: Mapping[int, Attempt]
    delayed: list[tuple[float, Job]]

    def end_unstarted(self, job: Job, reason: str) -> None: ...


class HostLeases:
    """Ports and resources for the loop's placements, and the waits other runs cause."""

    def __init__(self, loop: _LoopView) -> None:
        self.loop = loop
        self.since: dict[int, float] = {}  # job id → when it was first blocked
        self.blocked: dict[int, HostBlocked] = {}
        self.checked = False

    def needed(self, job: Job) -> bool:
        return bool(job.request.ports_needed or job.request.resources)

    def want(self, job: Job) -> tuple[int, tuple[int, int], dict[str, int], dict[str, int]]:
        """The job's ports and resources as LockDir.take asks them: (ports, range, resources,
        capacities)."""
        ctx = self.loop.ctx
        if not self.checked and self.needed(job):
            self.checked = True
            overlap = overlap_error(ctx.settings.ports)
            if overlap is not None:  # the default range; a configured one was refused early
                ctx.run_notes.append(overlap)
        return (
            job.request.ports_needed,
            ctx.settings.ports,
            dict(job.request.resources),
            dict(ctx.settings.resources),
        )

    def leased(self, job: Job, lease: Lease) -> None:
        """The job's lease holds its ports and resources: the record says which."""
        host: Any = lease.host
        self.since.pop(job.id, None)
        self.blocked.pop(job.id, None)
        if isinstance(host, HostLease):
            host.keep_master_port = self.loop.ctx.settings.keep_master_port
            self.loop.ctx.emit(
                "host_lease",
                job=job.id,
                nodeid=job.nodeid,
                ports=list(host.ports),
                resources=host.resources,
            )

    def wait(self, job: Job, got: HostBlocked, now: float) -> None:
        """Another run holds the job's ports or resources (LockDir.take held nothing): the job
        leaves the scheduler and waits out a short delay; past the lease timeout it ends."""
        ctx = self.loop.ctx
        self.loop.scheduler.finish(job)
        since = self.since.setdefault(job.id, now)
        self.blocked[job.id] = got
        timeout = ctx.settings.lease_timeout
        if now - since >= timeout:
            self.since.pop(job.id, None)
            job.foreign_wait = now - since
            reason = (
                f"no lease on {got.what} within --devpool-lease-timeout {timeout:g}s "
                f"(waited {now - since:.0f}s): {got.describe()}"
            )
            self.loop.end_unstarted(job, reason)
            return
        self.loop.delayed.append((now + HOST_RETRY, job))


def host_env(lease: Lease | None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a worker's tests see of its host lease: DEVPOOL_PORTS, MASTER_ADDR/PORT, ..."""
    host: Any = lease.host if lease is not None else None
    if not isinstance(host, HostLease):
        return {}
    env = ports_env(
        host.ports,
        "127.0.0.1",
        os.environ if environ is None else environ,
        keep_caller=host.keep_master_port,
    )
    if host.resources:
        env[RESOURCES_ENV] = ",".join(f"{n}={k}" for n, k in sorted(host.resources.items()))
    return env


def stamp(attempts: Sequence[Attempt], lease: Lease | None) -> None:
    """Note on each attempt the ports and resources its worker holds (record, JUnit)."""
    host: Any = lease.host if lease is not None else None
    if isinstance(host, HostLease):
        for attempt in attempts:
            attempt.ports = host.ports
            attempt.resources = tuple(sorted(host.resources.items()))


def properties(attempt: Attempt) -> list[tuple[str, str]]:
    """JUnit properties devpool.ports and devpool.resources, where the attempt held any."""
    out = []
    if attempt.ports:
        out.append(("devpool.ports", ",".join(str(port) for port in attempt.ports)))
    if attempt.resources:
        out.append(("devpool.resources", ",".join(f"{n}={k}" for n, k in attempt.resources)))
    return out


def record_fields(attempt: Attempt) -> dict[str, Any]:
    """The run record's fields for the same facts."""
    out: dict[str, Any] = {}
    if attempt.ports:
        out["ports"] = list(attempt.ports)
    if attempt.resources:
        out["resources"] = dict(attempt.resources)
    return out
