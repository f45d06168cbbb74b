"""Demo suite on simulated devices: every device test proves it holds its devices alone."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

GUARDS = Path(tempfile.gettempdir()) / "devpool-demo-guards"


@pytest.fixture
def exclusive_devices(
    devpool_devices: list[int], devpool_platform: str | None
) -> Iterator[list[int]]:
    """Claim each device with an exclusive-create guard file: a second holder would fail here."""
    GUARDS.mkdir(exist_ok=True)
    claimed = []
    try:
        for device in devpool_devices:
            guard = GUARDS / f"{devpool_platform}-{device}"
            fd = os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY)  # FileExistsError = overlap
            os.close(fd)
            claimed.append(guard)
        yield devpool_devices
    finally:
        for guard in claimed:
            guard.unlink()


def simulate_work(seconds: float) -> float:
    """Busy the 'device' for a while and return a checksum, as a kernel test would."""
    end = time.monotonic() + seconds
    total = 0.0
    while time.monotonic() < end:
        total += sum(i * 0.5 for i in range(200))
        time.sleep(0.01)
    return total
