"""The thread budget: each test process's share of the cores, in OMP_NUM_THREADS and its kin.

A library's thread pool is as wide as the host unless told otherwise, so N workers of a
torch suite on N cores run N × N spinning threads, each test slower than alone. torchrun
sets OMP_NUM_THREADS=1 for each rank for that reason. Here every worker, and every
process a test starts through the environment, gets the cores this process may use
divided among the tests that run at once (at least one); a `cpus(n)` test gets n. A
variable the user set is theirs, never overridden: a nonsense value is passed through
with one line said in the header. On a Ray cluster this process's cores are not the
nodes': each node sizes its own tests' budget (backends/ray/threads.py), and this one
only says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from devpool.devices.cores import Cores
from devpool.wording import counted
from devpool.worker.threads import BUDGET_ENV, THREAD_VARIABLES, thread_count


@dataclass(frozen=True)
class ThreadBudget:
    """Threads per test process, and which variables the user set (kept as they are)."""

    cores: Cores
    at_once: int  # tests that may run at once
    user_set: Mapping[str, str] = field(default_factory=dict)
    per_node: bool = False  # a Ray cluster's: each node sets its tests' variables

    @classmethod
    def of(
        cls,
        cores: Cores,
        max_parallel: int,
        cpu_slots: int,
        devices: int,
        environ: Mapping[str, str],
        per_node: bool = False,
    ) -> ThreadBudget:
        """CPU tests run at most cpu_slots at once, device tests at most one per device,
        and all of them at most max_parallel."""
        at_once = max(1, min(max_parallel, cpu_slots + devices))
        user = {name: environ[name] for name in THREAD_VARIABLES if name in environ}
        return cls(cores, at_once, user, per_node)

    @property
    def per_test(self) -> int:
        return max(1, self.cores.count // self.at_once)

    def env(self, cpus: int = 0) -> dict[str, str]:
        """The variables a test process gets: cpus threads for a cpus(n) test, else the
        share; the user's own variables are left out (the process inherits them). None on
        a Ray cluster: there each node sets them from its own cores."""
        if self.per_node:
            return {}
        threads = str(cpus or self.per_test)
        env = {name: threads for name in THREAD_VARIABLES if name not in self.user_set}
        env[BUDGET_ENV] = threads
        return env

    def header(self) -> list[str]:
        """One line for the header, and one for each thread variable set to nonsense."""
        kept = ", ".join(f"{name}={value}" for name, value in self.user_set.items())
        tests = counted(self.at_once, "test")
        line = (
            f"devpool: threads: {self.per_test} per test ({self.cores.describe()}, "
            f"{tests} at once; cpus(n) gets n)"
        )
        if self.per_node:
            line = (
                "devpool: threads: each Ray node's own cores, a test holding k of its D "
                "devices gets cores × k ÷ (D + cpu slots), a CPU test cores ÷ (D + cpu slots); "
                "cpus(n) gets n"
            )
        line += f"; yours kept: {kept}" if kept else f"; in {THREAD_VARIABLES[0]} and its kin"
        lines = [line]
        for name, value in self.user_set.items():
            if thread_count(value) is None:
                lines.append(
                    f"devpool: warning: {name}={value!r} is not a whole number ≥ 1; passed to "
                    "tests as it is (libraries may ignore it and use every core)"
                )
        return lines
