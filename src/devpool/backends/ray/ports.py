"""Leased ports under Ray: taken on the node that runs rank 0, the same for every rank.

Rank 0's actor leases the ports in its node's lock folder (devices/ports.py), so runs that
share that node never hand out one port twice, and holds them until the actor stops. Every
rank then gets the same DEVPOOL_PORTS, MASTER_ADDR (rank 0's address) and MASTER_PORT.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devpool.devices.leases import Holder, Lease
from devpool.devices.ports import ports_env
from devpool.devices.resources import HostLease, take_host_lease

if TYPE_CHECKING:  # the rank actor imports this module: pytest stays out of it
    from devpool.config import Settings
    from devpool.plan.markers import Request


def lease_on_node(lock_dir: str, count: int, ports: tuple[int, int]) -> tuple[Lease, list[int]]:
    """In rank 0's actor: ``count`` ports leased on this node, as a lease to release at stop."""
    holder = Holder.for_this_process("ray-rank0", "")
    got = take_host_lease(Path(lock_dir), holder, count, tuple(ports), {}, {})  # type: ignore[arg-type]
    if not isinstance(got, HostLease):
        raise RuntimeError(f"no ports leased on this node: {got.describe()}")
    lease = Lease("ports", holder, [])
    lease.attach(got)
    return lease, list(got.ports)


def lease(actor: Any, settings: Settings, request: Request) -> list[int]:
    """The ports rank 0's actor leased for the test ([] when it needs none)."""
    if not request.ports_needed:
        return []
    import ray  # the Ray backend runs only where it is installed

    call = actor.lease_ports.remote(str(settings.lock_dir), request.ports_needed, settings.ports)
    return [int(port) for port in ray.get(call)]


def rank_env(ports: list[int], master_addr: str, keep_caller: bool = False) -> dict[str, str]:
    """What every rank's process sees of the ports: the leased port is MASTER_PORT, over the
    caller's unless --devpool-keep-master-port."""
    return ports_env(ports, master_addr, os.environ, keep_caller=keep_caller)
