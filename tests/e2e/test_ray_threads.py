"""The thread budget on a real two-node Ray cluster on loopback: each test's threads are
its share of its own node's cores, not the controller's (backends/ray/threads.py).

The second node's processes read a cgroup root that gives them one core, and the
expected value of every test comes from its node's own cores: a test holding k of a
node's 4 devices gets cores × k ÷ (4 + the CPU slots), a CPU test cores ÷ (4 + the CPU
slots), a cpus(2) test 2, on whichever node Ray put it. (On a host of 2 cores every
share is 1: that a node's own cores count, not the controller's, is shown in
tests/backends/test_ray_node_budget.py with a 128-core node.) The templates the ranks fork
from are sized the same way, and a variable the user set on the controller is kept.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from ray_cluster import NODE_NPU, PYPROJECT, Cluster, run_ray, two_node_cluster

from devpool.devices.cores import CGROUP_ROOT_ENV, usable_cores
from devpool.worker.threads import BUDGET_ENV, THREAD_VARIABLES

CPU_SLOTS = 2

CONFTEST = """
import json, os, sys
from pathlib import Path

OUT = Path({out!r})


def record(name):
    (OUT / f"{{name}}-{{os.getpid()}}.json").write_text(json.dumps(dict(
        node=os.environ.get("DEVPOOL_RAY_NODE_ID"),
        devices=os.environ.get("DEVPOOL_DEVICES", ""),
        omp=os.environ.get("OMP_NUM_THREADS"),
        budget=os.environ.get("DEVPOOL_THREADS"),
        mkl=os.environ.get("MKL_NUM_THREADS"),
    )))


# A node's template collects once and its workers fork from it: what it was given.
if any(arg.startswith("template,") for arg in sys.argv):
    record("template")
"""

TESTS = """
import pytest
from conftest import record


@pytest.mark.nodes(2)
@pytest.mark.device_count(4)
def test_whole_nodes(devpool_node):
    record(f"whole-rank{devpool_node.rank}")


@pytest.mark.device_count(2)
def test_two_devices():
    record("two")


@pytest.mark.ranks(2, devices_per_rank=2)
def test_two_ranks(devpool_rank):
    record(f"ranks-rank{devpool_rank.rank}")


def test_cpu():
    record("cpu")


@pytest.mark.cpus(2)
def test_two_cores():
    record("cpus")
"""


@pytest.fixture(scope="module")
def one_core(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cgroup root whose CPU quota is one core."""
    root = tmp_path_factory.mktemp("cgroup")
    (root / "cpu.max").write_text("100000 100000\n")
    return root


@pytest.fixture(scope="module")
def nodes(one_core: Path) -> Iterator[Cluster]:
    """Two Ray nodes on 127.0.0.1, 4 NPU each, the second with one core; stopped through
    Ray's own API."""
    with two_node_cluster(second_env={CGROUP_ROOT_ENV: str(one_core)}) as started:
        yield started


def node_cores(cluster: Cluster, one_core: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """Each node's id → the cores its processes may use, as devpool counts them there."""
    head = cluster.head_node.node_id
    (second,) = [node.node_id for node in cluster.list_all_nodes() if node.node_id != head]
    with monkeypatch.context() as patched:
        patched.delenv(CGROUP_ROOT_ENV, raising=False)
        cores = {head: usable_cores().count}
        patched.setenv(CGROUP_ROOT_ENV, str(one_core))
        cores[second] = usable_cores().count
    return cores


def share(cores: int, devices: int) -> int:
    """A node runs its NODE_NPU device tests and the CPU slots at once: each test's share of
    its cores, by the devices it holds (a CPU test one share)."""
    return max(1, cores * max(1, devices) // (NODE_NPU + CPU_SLOTS))


def test_each_test_gets_its_share_of_its_own_nodes_cores(
    pytester: pytest.Pytester,
    nodes: Cluster,
    one_core: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # whole pytest starts, faster
    for name in (*THREAD_VARIABLES, BUDGET_ENV, CGROUP_ROOT_ENV):
        monkeypatch.delenv(name, raising=False)  # the controller's host sets none
    monkeypatch.setenv("MKL_NUM_THREADS", "3")  # the user's own: kept on every node
    cores = node_cores(nodes, one_core, monkeypatch)
    out = pytester.path / "out"
    out.mkdir()
    pytester.makepyprojecttoml(PYPROJECT)
    pytester.makeconftest(CONFTEST.format(out=str(out)))
    pytester.makepyfile(test_budget=TESTS)
    record = pytester.path / "record.jsonl"
    result = run_ray(pytester, nodes, record, f"--devpool-cpu-slots={CPU_SLOTS}")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*5 passed*"])
    header = [line for line in result.outlines if line.startswith("devpool: threads:")]
    assert header == [
        "devpool: threads: each Ray node's own cores, a test holding k of its D devices gets "
        "cores × k ÷ (D + cpu slots), a CPU test cores ÷ (D + cpu slots); cpus(n) gets n; "
        "yours kept: MKL_NUM_THREADS=3"
    ]
    seen = {path.stem.rsplit("-", 1)[0]: json.loads(path.read_text()) for path in out.iterdir()}
    held = {"whole-rank0": 4, "whole-rank1": 4, "two": 2, "ranks-rank0": 2, "ranks-rank1": 2}
    held |= {"cpu": 0}
    for name, devices in held.items():
        got = seen[name]
        expected = str(share(cores[got["node"]], devices))
        assert (got["omp"], got["budget"], got["mkl"]) == (expected, expected, "3"), (name, got)
    # STRICT_SPREAD: one rank on each node, so each node's own count shows.
    assert {seen["whole-rank0"]["node"], seen["whole-rank1"]["node"]} == set(cores)
    assert (seen["cpus"]["omp"], seen["cpus"]["budget"]) == ("2", "2")
    templates = [json.loads(path.read_text()) for path in out.glob("template-*.json")]
    assert templates, "no node's template collected: the ranks did not fork"
    for template in templates:
        devices = len([d for d in template["devices"].split(",") if d])
        expected = str(share(cores[template["node"]], devices))
        assert (template["omp"], template["budget"], template["mkl"]) == (expected, expected, "3")
