"""Huawei Ascend NPUs: npu-smi."""

from __future__ import annotations

import re
from collections.abc import Iterable

from devpool.devices.detection.tools import run_tool


def detect(timeout: float) -> list[int] | None:
    out = run_tool(["npu-smi", "info", "-l"], timeout)
    if out is None:
        return None
    ids = re.findall(r"^\s*NPU ID\s*:\s*(\d+)\s*$", out, flags=re.MULTILINE)
    return sorted({int(i) for i in ids}) or None


def memory(devices: Iterable[int], timeout: float) -> dict[int, int]:
    found: dict[int, int] = {}
    for device in devices:
        out = run_tool(["npu-smi", "info", "-t", "memory", "-i", str(device)], timeout)
        # "HBM Capacity(MB) : 65536" (the NPU's own memory); older cards list DDR only.
        match = re.search(r"HBM Capacity\(MB\)\s*:\s*(\d+)", out or "") or re.search(
            r"DDR Capacity\(MB\)\s*:\s*(\d+)", out or ""
        )
        if match:
            found[device] = int(match[1]) * 2**20
    return found
