"""A baseline's runtime identity: what must be equal for its fingerprints to hold.

Python, the machine, the exact versions of the key packages, and the version files of the
NVIDIA driver, CUDA, CANN and ROCm; with the bucket, platform and pool size, the key a
database store finds generations by (store_pg.py).
"""

from __future__ import annotations

import hashlib
import json
import platform as host_platform
import sys
from collections.abc import Iterable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any


def identity(key_packages: Iterable[str]) -> dict[str, Any]:
    """Python, the exact versions of the key packages, and the driver where it is known."""
    packages: dict[str, str | None] = {}
    for name in sorted(set(key_packages)):
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = None
    return {
        "python": f"{sys.implementation.name} {host_platform.python_version()}",
        "machine": host_platform.machine(),
        "packages": packages,
        **toolkits(),
    }


def identity_key(
    bucket_id: str, platform: str | None, pool: int | None, ident: Mapping[str, Any]
) -> str:
    """What a database store finds a generation by: its bucket, platform, runtime shape (the
    pool's size) and identity (Python, key packages, drivers and toolkits). Generations
    recorded on 8-device and on 1-device runners live side by side, each read by its own."""
    text = json.dumps([bucket_id, platform, pool, ident], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


# Version files of drivers and toolkits, read without starting any tool (nvidia-smi can
# hang on a sick host); the first one found of each kind counts.
VERSION_FILES = {
    "driver": ("/proc/driver/nvidia/version",),
    "cuda": ("/usr/local/cuda/version.json", "/usr/local/cuda/version.txt"),
    "cann": (
        "/usr/local/Ascend/ascend-toolkit/latest/version.cfg",
        "/usr/local/Ascend/driver/version.info",
    ),
    "rocm": ("/opt/rocm/.info/version",),
}


def toolkits(files: Mapping[str, Sequence[str]] = VERSION_FILES) -> dict[str, str | None]:
    """Kind → a digest of its version file (the exact text counts), None where absent."""
    found: dict[str, str | None] = {}
    for kind, paths in files.items():
        found[kind] = None
        for path in paths:
            try:
                text = Path(path).read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            first = text.strip().splitlines()[0][:80] if text.strip() else ""
            digest = hashlib.sha256(text.encode()).hexdigest()[:12]
            found[kind] = f"{first} ({digest})"
            break
    return found
