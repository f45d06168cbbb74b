"""Device memory shared between tests: what each device may hand out, and the watch on use.

Capacity: a device's total memory (inventory.device_memory) less a reserve kept back for
the driver, the CUDA context of every process on it and fragmentation. Enforcement: in the
worker, torch's per-process limit when torch is there; in the controller, a watch that
compares what a test used with what it declared (NVML per process for cuda, a file the test
writes for sim) and names an overrun.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from devpool.devices.inventory import Inventory, device_memory
from devpool.devices.sizes import format_size

SIM_MEMORY_FILE = "DEVPOOL_SIM_MEMORY_FILE"  # where a sim test writes what it uses
DEVICE_MEMORY = "DEVPOOL_DEVICE_MEMORY"  # bytes per device the worker's tests declared
DEVICE_TOTAL = "DEVPOOL_DEVICE_TOTAL"  # the device's total bytes, for torch's fraction


def usable_memory(totals: Mapping[int, int], reserve: float) -> dict[int, int]:
    """Bytes each device may hand out to device_memory requests: its total less the reserve."""
    return {device: math.floor(total * (1 - reserve)) for device, total in totals.items()}


def capacity_of(inventory: Inventory, reserve: float, timeout: float = 10.0) -> dict[int, int]:
    """What each device of the session may hand out; {} when its memory is unknown."""
    totals = device_memory(inventory.platform, inventory.devices, timeout)
    if set(totals) != set(inventory.devices):
        return {}  # a device of unknown size: share none rather than guess
    return usable_memory(totals, reserve)


def worker_env(declared: int | None, totals: Mapping[int, int]) -> dict[str, str]:
    """What a worker of a memory lease needs in its environment (empty for whole devices)."""
    if declared is None:
        return {}
    env = {DEVICE_MEMORY: str(declared)}
    if totals:
        env[DEVICE_TOTAL] = str(min(totals.values()))
    return env


def apply_torch_limit(environ: Mapping[str, str] | None = None) -> float | None:
    """In a worker: cap torch's allocator at the declared share of each visible device.

    Called once before the first test; does nothing (None) without a declaration or
    without torch. Returns the fraction set.
    """
    env = os.environ if environ is None else environ
    declared, total = env.get(DEVICE_MEMORY), env.get(DEVICE_TOTAL)
    if not declared or not total:
        return None
    try:
        import torch  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    fraction: float = min(1.0, int(declared) / int(total))
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            torch.cuda.set_per_process_memory_fraction(fraction, index)
    return fraction


@dataclass(frozen=True)
class Overrun:
    """A test used more memory on a device than it declared."""

    platform: str
    device: int
    used: int
    declared: int

    def describe(self) -> str:
        """The line the failed test carries: 'used 14.2 GiB on sim:0, declared 8 GiB'."""
        return (
            f"used {format_size(self.used)} on {self.platform}:{self.device}, "
            f"declared {format_size(self.declared)}"
        )


# Out-of-memory errors of each platform's runtime (sim: what a test under test prints).
OUT_OF_MEMORY = re.compile(
    r"CUDA out of memory|OutOfMemoryError|HIP out of memory|NPU out of memory"
    r"|DEVPOOL-SIM-OOM"
)


def ran_out(text: str) -> bool:
    """Whether a failure's text says the device ran out of memory."""
    return OUT_OF_MEMORY.search(text) is not None


def reset_sim_usage(environ: Mapping[str, str] | None = None) -> None:
    """In a worker, before each test: a sim test's use starts from nothing."""
    path = (os.environ if environ is None else environ).get(SIM_MEMORY_FILE)
    if path:
        Path(path).unlink(missing_ok=True)


def read_sim_usage(path: Path, devices: Iterable[int]) -> dict[int, int]:
    """What a sim test wrote to DEVPOOL_SIM_MEMORY_FILE: bytes per device.

    The file holds JSON, either one number (bytes on each of the test's devices) or an
    object of device id → bytes. A missing or half-written file reads as no use.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    ids = list(devices)
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        return dict.fromkeys(ids, int(data))
    if not isinstance(data, dict):
        return {}
    usage = {}
    for key, value in data.items():
        if str(key).isdecimal() and int(key) in ids and isinstance(value, (int, float)):
            usage[int(key)] = int(value)
    return usage


def nvml_usage(pids: Iterable[int], devices: Iterable[int]) -> dict[int, int] | None:
    """Bytes the given processes use on each cuda device (NVML); None without pynvml."""
    try:
        import pynvml  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    wanted = set(pids)
    usage: dict[int, int] = {}
    try:
        pynvml.nvmlInit()
        try:
            for device in devices:
                handle = pynvml.nvmlDeviceGetHandleByIndex(device)
                procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                usage[device] = sum(int(p.usedGpuMemory or 0) for p in procs if p.pid in wanted)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVMLError has many subclasses: no answer is not an overrun
        return None
    return usage


def check_overrun(platform: str, declared: int, usage: Mapping[int, int]) -> Overrun | None:
    """The first device where use exceeds the declaration, or None."""
    for device, used in sorted(usage.items()):
        if used > declared:
            return Overrun(platform, device, used, declared)
    return None


class MemoryWatch:
    """The watch on one running test of a memory lease; the loop polls it while the test runs.

    For sim it reads the file the test writes; for cuda it asks NVML about the worker's
    process group. The loop ends the test `failed` with ``Overrun.describe()`` as its
    reason when ``poll`` returns an overrun, and keeps ``peak`` for the record.
    """

    def __init__(
        self,
        platform: str,
        kind: str,
        devices: Iterable[int],
        declared: int,
        sim_file: Path | None = None,
        pids: Iterable[int] = (),
    ) -> None:
        self.platform = platform
        self.kind = kind
        self.devices = tuple(devices)
        self.declared = declared
        self.sim_file = sim_file
        self.pids = tuple(pids)
        self.peak: dict[int, int] = {}

    def poll(self) -> Overrun | None:
        """Look once: the overrun if there is one, else None (use and peak updated)."""
        usage: Mapping[int, int] | None = None
        if self.kind == "sim" and self.sim_file is not None:
            usage = read_sim_usage(self.sim_file, self.devices)
        elif self.kind == "cuda":
            usage = nvml_usage(self.pids, self.devices)
        if not usage:
            return None
        for device, used in usage.items():
            self.peak[device] = max(self.peak.get(device, 0), used)
        return check_overrun(self.platform, self.declared, usage)
