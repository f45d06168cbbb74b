"""The cores this process may use: its CPU affinity, capped by a cgroup CPU quota.

`os.cpu_count()` counts the host's cores. A CI container given 8 of a host's 64 runs
with an affinity mask (`taskset`, `--cpuset-cpus`) or a CFS quota (`--cpus=8`, a
Kubernetes CPU limit), and a thread pool sized to 64 there spins 8× more threads than it
has cores. The quota is read along the process's own cgroup path up to the root, the
smallest one counting: cgroup v2's `cpu.max`, v1's `cpu.cfs_quota_us` / `cpu.cfs_period_us`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
# Where the cgroup file tree is read: tests point it at a fake tree.
CGROUP_ROOT_ENV = "DEVPOOL_CGROUP_ROOT"
V1_CPU_FOLDERS = ("cpu", "cpu,cpuacct", "cpuacct,cpu")


@dataclass(frozen=True)
class Cores:
    """How many cores, and what limited them, said once in the header."""

    count: int
    affinity: int  # cores in this process's affinity mask
    quota: float | None = None  # cores the cgroup quota allows (None: no quota)

    def describe(self) -> str:
        """E.g. '2 cores by affinity' or '3 cores (cgroup quota 2.5 of 8 by affinity)'."""
        noun = "core" if self.count == 1 else "cores"
        if self.quota is not None and self.quota < self.affinity:
            quota = f"cgroup quota {self.quota:g} of {self.affinity} by affinity"
            return f"{self.count} {noun} ({quota})"
        return f"{self.count} {noun} by affinity"


def usable_cores() -> Cores:
    """The cores this process may use: affinity, capped by the cgroup quota (at least 1)."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        affinity = os.cpu_count() or 1
    root = Path(os.environ.get(CGROUP_ROOT_ENV) or CGROUP_ROOT)
    quota = cgroup_quota(root, _own_cgroups())
    count = affinity if quota is None else min(affinity, max(1, math.ceil(quota)))
    return Cores(max(1, count), affinity, quota)


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup path per controller list ('' for v2's unified hierarchy)."""
    paths: dict[str, str] = {}
    try:
        text = Path("/proc/self/cgroup").read_text(encoding="utf-8")
    except OSError:
        return paths
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            paths[parts[1]] = parts[2]
    return paths


def cgroup_quota(root: Path, own: dict[str, str]) -> float | None:
    """The smallest CPU quota, in cores, on this process's cgroup path; None: none set."""
    quotas: list[float] = []
    for folder in _upwards(root, own.get("", "/")):
        quotas += _v2_quota(folder / "cpu.max")
    for name in V1_CPU_FOLDERS:
        if (root / name).is_dir():
            path = next((p for c, p in own.items() if "cpu" in c.split(",")), "/")
            for folder in _upwards(root / name, path):
                quotas += _v1_quota(folder)
            break
    return min(quotas) if quotas else None


def _upwards(mount: Path, path: str) -> list[Path]:
    """The folders from a cgroup's own up to its hierarchy's root, those that exist."""
    parts = [p for p in path.split("/") if p and p != ".."]
    folders = [mount.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]
    return [f for f in folders if f.is_dir()]


def _v2_quota(path: Path) -> list[float]:
    """cgroup v2's cpu.max: 'QUOTA PERIOD' in microseconds, or 'max PERIOD'."""
    try:
        fields = path.read_text(encoding="utf-8").split()
    except OSError:
        return []
    if len(fields) != 2 or fields[0] == "max":
        return []
    try:
        quota, period = int(fields[0]), int(fields[1])
    except ValueError:
        return []
    return [quota / period] if quota > 0 and period > 0 else []


def _v1_quota(folder: Path) -> list[float]:
    """cgroup v1's cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us."""
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text(encoding="utf-8"))
        period = int((folder / "cpu.cfs_period_us").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [quota / period] if quota > 0 and period > 0 else []
