"""NVIDIA devices: NVML when pynvml is there, else nvidia-smi."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from devpool.devices.detection.tools import run_tool

T = TypeVar("T")


def _int_lines(text: str) -> list[int] | None:
    ids: list[int] = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if not line.isdecimal():
            return None
        ids.append(int(line))
    return sorted(set(ids)) or None


def nvml(ask: Callable[[Any], T]) -> T | None:
    """One NVML question, or None when pynvml is missing or NVML does not answer."""
    try:
        nvml = importlib.import_module("pynvml")
    except ImportError:
        return None
    try:
        nvml.nvmlInit()
        try:
            return ask(nvml)
        finally:
            nvml.nvmlShutdown()
    except Exception:  # NVMLError has many subclasses; nvidia-smi may still answer
        return None


def detect(timeout: float) -> list[int] | None:
    count = nvml(lambda nvml: int(nvml.nvmlDeviceGetCount()))
    if count is not None:
        return list(range(count)) or None
    out = run_tool(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], timeout)
    return None if out is None else _int_lines(out)


def memory(devices: Iterable[int], timeout: float) -> dict[int, int]:
    """Total memory per cuda device in bytes: NVML when pynvml is there, else nvidia-smi."""
    wanted = set(devices)
    totals = nvml(
        lambda nvml: {
            d: int(nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(d)).total)
            for d in sorted(wanted)
        }
    )
    if totals is not None:
        return totals
    argv = ["nvidia-smi", "--query-gpu=index,memory.total", "--format=csv,noheader,nounits"]
    out = run_tool(argv, timeout)
    found: dict[int, int] = {}
    for line in (out or "").splitlines():
        index, _, mib = line.partition(",")
        if index.strip().isdecimal() and mib.strip().isdecimal() and int(index) in wanted:
            found[int(index)] = int(mib) * 2**20
    return found


def uuid_indexes(timeout: float = 10.0) -> dict[str, int] | None:
    out = run_tool(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"], timeout)
    if out is None:
        return None
    table: dict[str, int] = {}
    for line in out.splitlines():
        if not line.strip():
            continue
        index, comma, uuid = line.partition(",")
        if not comma or not index.strip().isdecimal() or not uuid.strip():
            return None
        table[uuid.strip()] = int(index.strip())
    return table or None
