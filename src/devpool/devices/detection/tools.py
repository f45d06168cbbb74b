"""Running a vendor tool (nvidia-smi, rocm-smi, npu-smi) quietly, with a bound."""

from __future__ import annotations

import shutil
import subprocess


def run_tool(argv: list[str], timeout: float) -> str | None:
    """Stdout of a command, or None when it is absent, fails or outlives timeout."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.SubprocessError, UnicodeDecodeError):
        return None
    return done.stdout if done.returncode == 0 else None
