"""The Ray end-to-end tests' cluster and sessions, shared by test_ray.py and
test_ray_select.py: two Ray nodes on loopback (the `cluster` fixture of conftest.py starts
them with two_node_cluster) and a devpool session on them. A test module imports this
first: without Ray it skips the module (outside CI).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

# Ray reads it when imported: every Ray process of these tests binds to 127.0.0.1 only.
# Set for this process and so for every child session (and their Ray workers) too.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

try:
    import ray  # noqa: F401
    from ray.cluster_utils import Cluster
except ImportError:
    if os.environ.get("CI") == "true":
        raise
    pytest.skip("Ray is not installed (pip install -e '.[ray]')", allow_module_level=True)

PLUGIN_ARGS = ("-p", "devpool.plugin", "-p", "no:cacheprovider")
# The built-in sim platform, counted in the cluster's NPU resource.
PYPROJECT = """
[tool.devpool.platforms]
sim = { kind = "sim", ray-resource = "NPU" }
"""
NODE_NPU = 4


@contextmanager
def two_node_cluster() -> Iterator[Cluster]:
    """Two Ray nodes on 127.0.0.1, 4 NPU each; stopped through its own API."""
    started = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"NPU": NODE_NPU}}
    )
    try:
        started.add_node(num_cpus=1, resources={"NPU": NODE_NPU})
        started.wait_for_nodes()
        yield started
    finally:
        started.shutdown()


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
