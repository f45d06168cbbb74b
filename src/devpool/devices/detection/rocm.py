"""AMD devices: rocm-smi, else the AMD render nodes when the ROCm driver is loaded."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from devpool.devices.detection.tools import run_tool

# Module-level so tests can point them at a temporary tree.
_KFD = Path("/dev/kfd")
_DRM_SYS = Path("/sys/class/drm")
_AMD_PCI_VENDOR = "0x1002"


def detect(timeout: float) -> list[int] | None:
    out = run_tool(["rocm-smi", "--showid", "--csv"], timeout)
    if out is not None:
        ids = re.findall(r"^card(\d+),", out, flags=re.MULTILINE)
        if ids:
            return sorted({int(i) for i in ids})
    # Without rocm-smi, count AMD render nodes; /dev/kfd means the ROCm driver is loaded.
    if not _KFD.exists():
        return None
    count = 0
    for node in sorted(_DRM_SYS.glob("renderD*")):
        try:
            vendor = (node / "device" / "vendor").read_text().strip()
        except OSError:
            continue
        if vendor == _AMD_PCI_VENDOR:
            count += 1
    return list(range(count)) or None


def memory(devices: Iterable[int], timeout: float) -> dict[int, int]:
    out = run_tool(["rocm-smi", "--showmeminfo", "vram", "--csv"], timeout)
    wanted = set(devices)
    found: dict[int, int] = {}
    for match in re.finditer(r"^card(\d+),(\d+),", out or "", flags=re.MULTILINE):
        if int(match[1]) in wanted:
            found[int(match[1])] = int(match[2])
    return found
