"""The thread budget on a Ray node: each rank's share of its own node's cores.

The controller's cores say nothing of a node's: a run driven from a 2-core CI box would
give every test on a 128-core, 8-device node one thread. So on a cluster the controller
sets no thread variable (run/threads.py) and each node's actor sizes the budget of the
ranks and templates it starts from the cores it may use there (devices/cores.py), divided
as on a host among the tests that may run there at once, its D device tests and the run's
CPU slots: a rank holding k of the node's devices gets cores × k ÷ (D + CPU slots) threads,
a CPU-only rank cores ÷ (D + CPU slots); at least one either way. A cpus(n) test gets n.
A thread variable already in the environment was set by the user on the controller, and
is kept.
"""

from __future__ import annotations

from collections.abc import Mapping

from devpool.devices.cores import usable_cores
from devpool.worker.threads import BUDGET_ENV, THREAD_VARIABLES


def node_share(cores: int, devices: int, node_devices: int, cpu_slots: int) -> int:
    """Threads for a rank holding `devices` of its node's `node_devices` (0: CPU-only)."""
    at_once = max(1, node_devices + cpu_slots)
    return max(1, cores * max(1, min(devices, node_devices)) // at_once)


def node_budget(
    env: Mapping[str, str], devices: int, node_devices: int, cpus: int, cpu_slots: int
) -> dict[str, str]:
    """The thread variables a rank's environment gets on this node: its share, or cpus
    (a cpus(n) test); those the environment has already are the user's, left out."""
    threads = cpus or node_share(usable_cores().count, devices, node_devices, cpu_slots)
    budget = {name: str(threads) for name in THREAD_VARIABLES if name not in env}
    budget[BUDGET_ENV] = str(threads)
    return budget
