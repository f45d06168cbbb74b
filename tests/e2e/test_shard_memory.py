"""End to end: `devpool shard` charges a device_memory test its share of a device."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SUITE = """
import pytest

@pytest.mark.device_memory("5GiB")
@pytest.mark.parametrize("n", range(4))
def test_small(n):
    pass

@pytest.mark.device_count(1)
def test_whole():
    pass
"""


def shard(cwd: Path) -> list[tuple[list[str], float]]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "DEVPOOL_"))}
    command = [sys.executable, "-m", "devpool.cli", "shard", "--runners", "2", "--platform"]
    command += ["sim", "--format", "json", "--", "test_s.py", "-p", "no:randomly"]
    done = subprocess.run(
        command, cwd=cwd, env=environ, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return [(s["tests"], s["device_seconds"]) for s in json.loads(done.stdout)["split"]]


def test_memory_tests_cost_their_share_where_the_platform_memory_is_configured(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_s.py").write_text(SUITE)
    small = [f"test_s.py::test_small[{n}]" for n in range(4)]
    # Memory unknown: each small test may hold a whole device, and is charged so.
    assert sorted(cost for _, cost in shard(tmp_path)) == [2.0, 3.0]
    (tmp_path / "pyproject.toml").write_text(
        '[tool.devpool]\nmemory-reserve = "0%"\n'
        '[tool.devpool.platforms]\nsim = { memory = "80GiB" }\n'
    )
    # 80 GiB devices: four 5 GiB tests take a quarter of one device-second, and go together.
    assert shard(tmp_path) == [(["test_s.py::test_whole"], 1.0), (small, 0.25)]
