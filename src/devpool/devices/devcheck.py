"""A device health check, run in a fresh process: `python -m devpool.devices.devcheck KIND DEVICE`.

After an error that poisons only a process's device context (a device-side assert, an
illegal memory access), the device itself may be fine. This check asks it in a process
that never met the error. Exit 0: healthy. Exit 1: not healthy, with one line saying why.
Exit 2: could not tell (no tool to ask), and the device stays in service.

- cuda: NVML reads the device's state, then a tiny kernel runs on it (where torch exists).
- sim: the JSON file named by DEVPOOL_SIM_HEALTH maps device ids to a failure reason
  (tests control it); a device not listed is healthy.
- rocm, ascend: the platform's SMI tool must answer for the device.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HEALTHY, UNHEALTHY, UNKNOWN = 0, 1, 2


def check_sim(device: int) -> tuple[int, str]:
    path = os.environ.get("DEVPOOL_SIM_HEALTH")
    if not path or not Path(path).exists():
        return HEALTHY, "sim device answered"
    try:
        table = json.loads(Path(path).read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError) as exc:
        return UNHEALTHY, f"cannot read {path}: {exc}"
    reason = table.get(str(device)) if isinstance(table, dict) else None
    return (UNHEALTHY, str(reason)) if reason else (HEALTHY, "sim device answered")


def check_cuda(device: int) -> tuple[int, str]:
    told = False
    try:
        import pynvml  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        pynvml = None
    if pynvml is not None:
        try:
            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(device)
            pynvml.nvmlDeviceGetMemoryInfo(handle)
            pynvml.nvmlDeviceGetUtilizationRates(handle)
            told = True
        except pynvml.NVMLError as exc:
            return UNHEALTHY, f"NVML query failed: {exc}"
    try:
        import torch  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        torch = None  # type: ignore[assignment,unused-ignore]
    if torch is not None:
        try:
            # The visibility variable shows this process the one device under check.
            x = torch.ones(256, device="cuda")
            value = float((x * 2).sum().item())
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - any failure of the device is the answer
            return UNHEALTHY, f"a tiny kernel failed: {type(exc).__name__}: {exc}"
        if value != 512.0:
            return UNHEALTHY, f"a tiny kernel computed {value}, not 512"
        return HEALTHY, "NVML state and a tiny kernel are fine" if told else "a tiny kernel ran"
    if told:
        return HEALTHY, "NVML state is fine (no torch for a kernel)"
    return UNKNOWN, "neither NVML nor torch is installed"


def check_smi(tool: str, args: list[str]) -> tuple[int, str]:
    if shutil.which(tool) is None:
        return UNKNOWN, f"{tool} is not installed"
    try:
        done = subprocess.run([tool, *args], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return UNHEALTHY, f"{tool} did not answer within 30s"
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
        return UNHEALTHY, f"{tool} failed: {last[0]}"
    return HEALTHY, f"{tool} answered"


def check(kind: str, device: int) -> tuple[int, str]:
    """One verdict on one device of a platform kind."""
    if kind == "sim":
        return check_sim(device)
    if kind == "cuda":
        return check_cuda(device)
    if kind == "rocm":
        return check_smi("rocm-smi", ["-d", str(device), "--showuse"])
    if kind == "ascend":
        return check_smi("npu-smi", ["info", "-t", "health", "-i", str(device)])
    return UNKNOWN, f"no health check for platform kind {kind!r}"


def main(argv: list[str]) -> int:
    kind, device = argv[0], int(argv[1])
    code, why = check(kind, device)
    print(why, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
