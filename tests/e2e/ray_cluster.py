"""The Ray end-to-end tests' sessions, shared by test_ray.py and test_ray_select.py: a
devpool session on the two loopback Ray nodes of tests/ray_nodes.py (the `cluster`
fixture of conftest.py starts them). A test module imports this first: without Ray it
skips the module (outside CI).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from ray_nodes import NODE_NPU, NODE_RESOURCES, Cluster, two_node_cluster

PLUGIN_ARGS = ("-p", "devpool.plugin", "-p", "no:cacheprovider")
# The built-in sim platform, counted in the cluster's NPU resource.
PYPROJECT = """
[tool.devpool.platforms]
sim = { kind = "sim", ray-resource = "NPU" }
"""
__all__ = ["NODE_NPU", "NODE_RESOURCES", "Cluster", "two_node_cluster"]


def ray_args(cluster: Cluster) -> tuple[str, ...]:
    """The options of a devpool session on the cluster, the sim platform's devices."""
    return ("--devpool-backend=ray", f"--devpool-ray-address={cluster.address}", "--devices=sim")


def run_ray(
    pytester: pytest.Pytester, cluster: Cluster, record: Path, *args: str
) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        *PLUGIN_ARGS,
        "--devpool-backend",
        "ray",
        "--devpool-ray-address",
        cluster.address,
        "--devices",
        "sim",
        f"--devpool-run-record={record}",
        f"--devpool-lock-dir={pytester.path / 'locks'}",
        *args,
        timeout=180,
    )


def job_ends(record: Path) -> list[dict[str, Any]]:
    events = [json.loads(line) for line in record.read_text().splitlines() if line.strip()]
    return [e for e in events if e["type"] == "job_end"]


def outcomes(record: Path) -> set[tuple[str, str]]:
    return {(e["nodeid"], e["outcome"]) for e in job_ends(record) if not e["retried"]}


def alive(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    try:
        return "zombie" not in status.read_text().lower()
    except OSError:
        return False


def wait_until(condition: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
