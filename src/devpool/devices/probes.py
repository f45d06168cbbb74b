"""Device health: who else is computing on a device, and which errors mean a device went bad.

A probe answers one question before a lease starts: is any process that is not ours
using these devices? Each platform kind has its own (NVML or nvidia-smi, npu-smi,
rocm-smi, a controllable fake for `sim`). A probe that hangs, is missing or cannot be
parsed answers "unknown" within its timeout; it never stalls the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devpool.errors import DevpoolError

PROBE_TIMEOUT = 5.0

# Errors that poison only the process that met them (its device context): the worker is
# discarded, and the device is retired only if a health check in a fresh process fails.
CONTEXT_PATTERNS: dict[str, tuple[str, ...]] = {
    "cuda": (
        r"device-side assert(ion)? triggered",
        r"an illegal memory access was encountered",
        r"an illegal instruction was encountered",
        r"misaligned address",
        r"unspecified launch failure",
    ),
    "rocm": (
        r"HIP error: an illegal memory access",
        r"Memory access fault by GPU",
        r"device-side assertion",
        r"hipErrorLaunchFailure",
    ),
    "ascend": (r"\b507015\b", r"\b507018\b", r"aicore exception", r"aicpu exception"),
    "sim": (r"DEVPOOL-SIM-CONTEXT",),
}

# Errors of the device itself: it is retired for the rest of the session at once.
DEVICE_PATTERNS: dict[str, tuple[str, ...]] = {
    "cuda": (
        r"uncorrectable ECC error",
        r"\bXid\b",
        r"GPU is lost",
        r"fallen off the bus",
        r"NVML_ERROR_GPU_IS_LOST",
    ),
    "rocm": (r"GPU Hang", r"amdgpu: GPU reset", r"HW Exception by GPU"),
    "ascend": (r"\bEL0004\b", r"multi[- ]bit ECC", r"device (is )?lost"),
    "sim": (r"DEVPOOL-SIM-FATAL",),
}

# The kinds a fatal error can be: what happens next depends on it.
CONTEXT = "context"
DEVICE = "device"


@dataclass(frozen=True)
class ForeignProcess:
    pid: int
    user: str = "?"
    name: str = ""

    def describe(self) -> str:
        who = f"pid {self.pid} (user {self.user}"
        return who + (f", {self.name})" if self.name else ")")


Busy = dict[int, list[ForeignProcess]]  # device → processes seen on it
Probe = Callable[[Sequence[int]], Busy | None]  # None: could not tell


def _owner(pid: int) -> str:
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return "?"
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return str(uid)


def run_tool(argv: list[str], timeout: float) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        # A session of its own: a tool that hangs is ended with whatever it started (a
        # wrapper script's child would otherwise outlive it, holding its output pipe).
        tool = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
    except OSError:
        return None
    try:
        out, _ = tool.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(tool.pid, signal.SIGKILL)
        tool.wait()
        return None
    return out if tool.returncode == 0 else None


def nvidia_probe(devices: Sequence[int], timeout: float = PROBE_TIMEOUT) -> Busy | None:
    """Compute processes per GPU: NVML when importable, else nvidia-smi."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            found: Busy = {}
            for device in devices:
                handle = pynvml.nvmlDeviceGetHandleByIndex(device)
                procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                found[device] = [ForeignProcess(p.pid, _owner(p.pid)) for p in procs]
            return found
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML here: fall back to the command
        pass
    index = run_tool(
        ["nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"], timeout
    )
    apps = run_tool(
        ["nvidia-smi", "--query-compute-apps=gpu_bus_id,pid,process_name", "--format=csv,noheader"],
        timeout,
    )
    if index is None or apps is None:
        return None
    bus_to_index = {}
    for line in index.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            bus_to_index[parts[1].lower()] = int(parts[0])
    busy: Busy = {device: [] for device in devices}
    for line in apps.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[1].isdigit():
            gpu = bus_to_index.get(parts[0].lower())
            if gpu is not None and gpu in busy:
                pid = int(parts[1])
                name = parts[2] if len(parts) > 2 else ""
                busy[gpu].append(ForeignProcess(pid, _owner(pid), name))
    return busy


def ascend_probe(devices: Sequence[int], timeout: float = PROBE_TIMEOUT) -> Busy | None:
    """Processes per NPU from `npu-smi info` (its process table: NPU id, chip, pid, name)."""
    text = run_tool(["npu-smi", "info"], timeout)
    if text is None:
        return None
    busy: Busy = {device: [] for device in devices}
    row = re.compile(r"^\|\s*(\d+)\s+(\d+)\s*\|\s*(\d+)\s*\|\s*(\S+)")
    for line in text.splitlines():
        match = row.match(line)
        if match and int(match.group(1)) in busy:
            pid = int(match.group(3))
            busy[int(match.group(1))].append(ForeignProcess(pid, _owner(pid), match.group(4)))
    return busy


def rocm_probe(devices: Sequence[int], timeout: float = PROBE_TIMEOUT) -> Busy | None:
    """Processes per GPU from `rocm-smi --showpidgpus`."""
    text = run_tool(["rocm-smi", "--showpidgpus"], timeout)
    if text is None:
        return None
    busy: Busy = {device: [] for device in devices}
    current: int | None = None
    for line in text.splitlines():
        pid = re.search(r"PID (\d+) is using (\d+) DRM device", line)
        if pid:
            current = int(pid.group(1))
            continue
        ids = re.findall(r"\d+", line) if current is not None else []
        for device in (int(i) for i in ids):
            if device in busy and current is not None:
                busy[device].append(ForeignProcess(current, _owner(current)))
        current = None if ids else current
    return busy


def sim_probe(devices: Sequence[int], path: Path | None) -> Busy | None:
    """The fake for `sim`: a JSON file {"3": [{"pid": 4242, "user": "ci2"}]} says who is busy."""
    if path is None:
        return {device: [] for device in devices}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {device: [] for device in devices}
    except (OSError, ValueError):
        return None
    busy: Busy = {device: [] for device in devices}
    for key, entries in data.items() if isinstance(data, dict) else []:
        if str(key).isdigit() and int(key) in busy and isinstance(entries, list):
            busy[int(key)] = [
                ForeignProcess(
                    int(e.get("pid", 0)), str(e.get("user", "?")), str(e.get("name", ""))
                )
                for e in entries
                if isinstance(e, dict)
            ]
    return busy


def probe_for(kind: str, environ: Mapping[str, str]) -> Probe:
    """The probe of one platform kind."""
    if kind == "cuda":
        return nvidia_probe
    if kind == "ascend":
        return ascend_probe
    if kind == "rocm":
        return rocm_probe
    fake = environ.get("DEVPOOL_SIM_BUSY")
    return lambda devices: sim_probe(devices, Path(fake) if fake else None)


def foreign(busy: Busy, ours: Iterable[int]) -> Busy:
    """Only the processes that are not ours (our workers and their children)."""
    mine = set(ours)
    return {d: [p for p in procs if p.pid not in mine] for d, procs in busy.items()}


def describe_busy(platform: str, busy: Busy) -> str:
    """'device sim:3 busy: pid 4242 (user ci2)'."""
    parts = [
        f"device {platform}:{device} busy: " + ", ".join(p.describe() for p in procs)
        for device, procs in sorted(busy.items())
        if procs
    ]
    return "; ".join(parts)


@dataclass(frozen=True)
class Fatal:
    """A fatal error found in a test's output: what matched, and its kind."""

    text: str
    kind: str  # CONTEXT (the process is poisoned) or DEVICE (the device is bad)


def report_text(report: Any) -> str:
    """Everything a test report says, for fatal patterns: its failure and the output
    captured while it ran."""
    parts = [str(report.longrepr) if report.longrepr is not None else ""]
    parts += [content for _, content in report.sections]
    return "\n".join(parts)


@dataclass(frozen=True)
class FatalPatterns:
    """Per-platform regular expressions of the two kinds of fatal errors."""

    device: tuple[re.Pattern[str], ...]
    context: tuple[re.Pattern[str], ...] = ()

    @classmethod
    def for_platform(
        cls, name: str, kind: str, table: Mapping[str, object] | None
    ) -> FatalPatterns:
        """[tool.devpool.fatal-patterns] `name` or `kind` replaces the defaults of a platform.

        A list names device-level errors (retire at once), as it always did; a table
        `{context = [...], device = [...]}` names both kinds."""
        device: object = DEVICE_PATTERNS.get(kind, ())
        context: object = CONTEXT_PATTERNS.get(kind, ())
        if table:
            chosen = table.get(name, table.get(kind))
            if isinstance(chosen, Mapping):
                unknown = sorted(set(chosen) - {CONTEXT, DEVICE})
                if unknown:
                    raise DevpoolError(
                        f"[tool.devpool.fatal-patterns] {name}: unknown key {unknown[0]!r} "
                        "(use context and device)"
                    )
                device = chosen.get(DEVICE, ())
                context = chosen.get(CONTEXT, ())
            elif chosen is not None:
                device, context = chosen, ()
        return cls(_compile(name, device), _compile(name, context))

    def sources(self) -> list[str]:
        """Every pattern's source, for a worker to check its own failures against."""
        return [pattern.pattern for pattern in (*self.device, *self.context)]

    def find(self, text: str) -> str | None:
        """The first fatal error of either kind in text, as matched, or None."""
        found = self.classify(text)
        return found.text if found is not None else None

    def classify(self, text: str) -> Fatal | None:
        """The fatal error in text, device-level first (it decides more), or None."""
        for kind, patterns in ((DEVICE, self.device), (CONTEXT, self.context)):
            for pattern in patterns:
                match = pattern.search(text)
                if match:
                    return Fatal(match.group(0), kind)
        return None


def _compile(name: str, chosen: object) -> tuple[re.Pattern[str], ...]:
    if not isinstance(chosen, (list, tuple)) or not all(isinstance(p, str) for p in chosen):
        raise DevpoolError(
            f"[tool.devpool.fatal-patterns] {name} must be a list of regular expressions"
        )
    compiled = []
    for text in chosen:
        try:
            compiled.append(re.compile(text))
        except re.error as exc:
            raise DevpoolError(
                f"[tool.devpool.fatal-patterns] {name}: {text!r} is not a regular "
                f"expression ({exc})"
            ) from None
    return tuple(compiled)
