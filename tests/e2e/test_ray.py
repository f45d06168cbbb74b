"""End to end on a real two-node Ray cluster on loopback: multi-node ranks, the demo suite,
unsatisfiable requests and a node lost mid-run.

One cluster serves the module (Ray starts slowly); the test that removes a node runs last
and adds one back. Every wait polls a condition under a deadline.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from ray_cluster import (
    NODE_NPU,
    PLUGIN_ARGS,
    PYPROJECT,
    Cluster,
    alive,
    job_ends,
    outcomes,
    ray_args,
    run_ray,
    two_node_cluster,
    wait_until,
)
from sessions import PORT_SERVER

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(autouse=True)
def _no_plugin_autoload(monkeypatch: pytest.MonkeyPatch) -> None:
    # Workers are whole pytest starts (on Ray nodes too): other installed plugins only slow
    # them down. The sessions and their workers inherit it.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


def test_two_ranks_on_two_nodes_talk_over_tcp(pytester: pytest.Pytester, cluster: Cluster) -> None:
    out = pytester.path / "out"
    out.mkdir()
    pytester.makepyprojecttoml(PYPROJECT)
    pytester.makepyfile(
        test_pair=f"""
        import json, os, socket, time
        from pathlib import Path
        import pytest

        OUT = Path({str(out)!r})

        def service_file(rank):
            return OUT / f"service-{{rank}}.pid"

        @pytest.mark.nodes(2)
        @pytest.mark.device_count(2)
        def test_pair(devpool_node, devpool_devices):
            # The peer service runs on every rank but rank 0, started before the test.
            deadline = time.monotonic() + 30
            while devpool_node.rank > 0 and not service_file(devpool_node.rank).exists():
                assert time.monotonic() < deadline, "the peer service never started"
                time.sleep(0.05)
            assert not service_file(0).exists()
            (OUT / f"rank{{devpool_node.rank}}.json").write_text(json.dumps(dict(
                rank=os.environ["DEVPOOL_NODE_RANK"],
                node=os.environ["DEVPOOL_RAY_NODE_ID"],
                devices=devpool_devices,
                world=devpool_node.world_size,
                peers=list(devpool_node.peers),
                master=[os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")],
                ports=os.environ.get("DEVPOOL_PORTS"),
                node_port=devpool_node.master_port,
            )))
            assert devpool_node.world_size == 2 and len(devpool_devices) == 2
            address = (devpool_node.master_addr, devpool_node.master_port)
            if devpool_node.rank == 0:
                with socket.create_server(address) as server:
                    server.settimeout(60)
                    conn, _ = server.accept()
                    with conn:
                        assert conn.recv(64) == b"hello from rank 1"
                        conn.sendall(b"hello from rank 0")
            else:
                deadline = time.monotonic() + 60
                while True:
                    try:
                        conn = socket.create_connection(address, timeout=5)
                        break
                    except OSError:
                        assert time.monotonic() < deadline, "rank 0 never listened"
                        time.sleep(0.05)
                with conn:
                    conn.sendall(b"hello from rank 1")
                    assert conn.recv(64) == b"hello from rank 0"
                print("rank 1 got its answer")
        """
    )
    record = pytester.path / "record.jsonl"
    service = (
        "python -c 'import os, pathlib, time; "
        f'pathlib.Path("{out}/service-" + os.environ["DEVPOOL_NODE_RANK"] + ".pid")'
        ".write_text(str(os.getpid())); time.sleep(600)'"
    )
    result = run_ray(pytester, cluster, record, "-rA", f"--devpool-peer-service={service}")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*1 passed*"])
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["rank"] for r in ranks] == ["0", "1"]
    assert ranks[0]["node"] != ranks[1]["node"]  # STRICT_SPREAD: one node each
    assert all(r["world"] == 2 and len(r["devices"]) == 2 for r in ranks)
    # One port leased on rank 0's node: every rank meets on the same MASTER_ADDR/PORT.
    assert ranks[0]["master"] == ranks[1]["master"]
    assert ranks[0]["ports"] == ranks[1]["ports"] == ranks[0]["master"][1]
    assert 20000 <= int(ranks[0]["master"][1]) <= 29999
    assert ranks[0]["node_port"] == int(ranks[0]["master"][1])
    (end,) = job_ends(record)
    assert end["outcome"] == "passed"
    assert [r["rank"] for r in end["ranks"]] == [0, 1]
    assert {r["node_id"] for r in end["ranks"]} == {r["node"] for r in ranks}
    for rank in end["ranks"]:
        assert len(rank["devices"]) == 2 and Path(rank["log"]).is_file()
    service_pid = int((out / "service-1.pid").read_text())
    wait_until(lambda: not alive(service_pid), 10, "the peer service to stop")
    # Each rank's captured output comes back labelled with its rank.
    result.stdout.fnmatch_lines(["*Captured stdout call*rank 1*", "rank 1 got its answer"])


def test_failing_rank_fails_the_test_labelled(pytester: pytest.Pytester, cluster: Cluster) -> None:
    pytester.makepyprojecttoml(PYPROJECT)
    pytester.makepyfile(
        test_one_bad_rank="""
        import pytest

        @pytest.mark.nodes(2)
        @pytest.mark.device_count(1)
        def test_rank1_fails(devpool_node):
            assert devpool_node.rank == 0, "only rank 0 is right"
        """
    )
    record = pytester.path / "record.jsonl"
    result = run_ray(pytester, cluster, record)
    assert result.ret == 1, result.stdout.str()
    result.stdout.fnmatch_lines(["*[[]rank 1[]]*only rank 0 is right*", "*1 failed*"])
    # Rank 0 passed, unless rank 1's failure reached the controller first: then it was
    # ended for it (backends/failfast.py), and says only that.
    rank_0 = [line for line in result.stdout.lines if "[rank 0]" in line]
    assert all("ended: rank 1 failed" in line for line in rank_0), rank_0
    (end,) = job_ends(record)
    assert end["outcome"] == "failed" and len(end["ranks"]) == 2


def test_demo_suite_same_outcomes_as_local(pytester: pytest.Pytester, cluster: Cluster) -> None:
    demo = pytester.path / "examples"
    shutil.copytree(EXAMPLES, demo, ignore=shutil.ignore_patterns("__pycache__"))
    # Two Ray nodes on one host both have NPU 0-3: the demo's host-wide guard files get
    # the Ray node in their name, so that two nodes' device 0 are two devices.
    conftest = demo / "conftest.py"
    text = conftest.read_text()
    node_guard = "f\"{devpool_platform}-{os.environ.get('DEVPOOL_RAY_NODE_ID', '')}-{device}\""
    assert 'f"{devpool_platform}-{device}"' in text
    conftest.write_text(text.replace('f"{devpool_platform}-{device}"', node_guard))
    pytester.makepyprojecttoml(PYPROJECT)
    local_record = pytester.path / "local.jsonl"
    local = pytester.runpytest_subprocess(
        *PLUGIN_ARGS,
        "examples",
        "--devices",
        f"sim:0-{NODE_NPU - 1}",
        f"--devpool-run-record={local_record}",
        f"--devpool-lock-dir={pytester.path / 'locks'}",
        timeout=120,
    )
    ray_record = pytester.path / "ray.jsonl"
    on_ray = run_ray(pytester, cluster, ray_record, "examples")
    assert local.ret == on_ray.ret, on_ray.stdout.str()
    expected = outcomes(local_record)
    assert len(expected) >= 20
    assert len([t for t in expected if t[0].startswith("examples/test_distributed")]) == 2
    assert outcomes(ray_record) == expected, on_ray.stdout.str()
    # The 8-device test fits neither the 4-device pool nor any 4-NPU node.
    assert ("examples/test_collectives.py::test_full_node_training_step", "infra") in expected
    on_ray.stdout.fnmatch_lines(["*needs 8 NPU; cluster has 2 nodes with 4 NPU*"])


RANKS_ON_RAY = """
import json
import os
import socket
import time
from pathlib import Path

import pytest

KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
        "MASTER_PORT", "DEVPOOL_DEVICES", "DEVPOOL_RANK_DEVICES", "DEVPOOL_RAY_NODE_ID")


def meet():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    address = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    if rank == 0:
        server = socket.create_server(address)
        peers = [server.accept()[0] for _ in range(world - 1)]
        server.close()  # before any rank goes on: its next meet() must find no listener
        for peer in peers:
            peer.sendall(b"go")
            peer.close()
        return
    deadline = time.monotonic() + 60
    while True:
        try:
            peer = socket.create_connection(address)
            break
        except OSError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert peer.recv(2) == b"go"


@pytest.mark.nodes(2)
@pytest.mark.ranks(4)
def test_four_ranks_over_two_nodes():
    Path(OUT, "rank" + os.environ["RANK"] + ".json").write_text(
        json.dumps({k: os.environ.get(k) for k in KEYS})
    )
    meet()


@pytest.mark.ranks(2, devices_per_rank=0)
def test_two_ranks_one_fails():
    if os.environ["RANK"] == "1":
        assert False, "rank one on Ray"
    time.sleep(120)
"""


def test_ranks_spread_over_nodes_with_torchruns_environment(
    pytester: pytest.Pytester, cluster: Cluster, tmp_path: Path
) -> None:
    pytester.makepyprojecttoml(PYPROJECT)
    pytester.makepyfile(test_ranks=f"OUT = {str(tmp_path)!r}\n" + RANKS_ON_RAY)
    record = pytester.path / "record.jsonl"
    began = time.monotonic()
    result = run_ray(pytester, cluster, record, "-p", "no:randomly")
    assert result.ret == 1, result.stdout.str()
    assert outcomes(record) == {
        ("test_ranks.py::test_four_ranks_over_two_nodes", "passed"),
        ("test_ranks.py::test_two_ranks_one_fails", "failed"),
    }, result.stdout.str()
    assert time.monotonic() - began < 100  # the failing rank's peer did not sleep 120 s
    result.stdout.fnmatch_lines(["*[[]rank 0[]] ended: rank 1 failed*"])
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    for rank, env in enumerate(seen):
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "4"
        assert env["LOCAL_RANK"] == str(rank % 2) and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["GROUP_RANK"] == str(rank // 2)
        assert env["MASTER_ADDR"] == seen[0]["MASTER_ADDR"]
        assert env["MASTER_PORT"] == seen[0]["MASTER_PORT"]
        # Every rank sees its node's devices of the test in rank order: its own at LOCAL_RANK.
        visible = env["DEVPOOL_DEVICES"].split(",")
        assert len(visible) == 2 and visible[rank % 2] == env["DEVPOOL_RANK_DEVICES"]
    assert seen[0]["DEVPOOL_RAY_NODE_ID"] == seen[1]["DEVPOOL_RAY_NODE_ID"]
    assert seen[2]["DEVPOOL_RAY_NODE_ID"] == seen[3]["DEVPOOL_RAY_NODE_ID"]
    assert seen[0]["DEVPOOL_RAY_NODE_ID"] != seen[2]["DEVPOOL_RAY_NODE_ID"]


def test_unsatisfiable_nodes_fail_fast(pytester: pytest.Pytester, cluster: Cluster) -> None:
    pytester.makepyprojecttoml(PYPROJECT)
    pytester.makepyfile(
        test_big="""
        import pytest

        @pytest.mark.nodes(3)
        @pytest.mark.device_count(2)
        def test_three_nodes():
            pass
        """
    )
    began = time.monotonic()
    result = run_ray(pytester, cluster, pytester.path / "record.jsonl")
    took = time.monotonic() - began
    assert result.ret == 1, result.stdout.str()
    result.stdout.fnmatch_lines(
        ["*needs 3 nodes × 2 NPU; cluster has 2 nodes with 4 NPU*", "*1 infra*"]
    )
    assert took < 30, f"took {took:.0f}s"


def test_devices_spec_with_ids_is_refused(pytester: pytest.Pytester, cluster: Cluster) -> None:
    pytester.makepyprojecttoml(PYPROJECT)
    pytester.makepyfile(test_x="def test_x(): pass")
    result = pytester.runpytest_subprocess(
        *PLUGIN_ARGS,
        "--devpool-backend=ray",
        f"--devpool-ray-address={cluster.address}",
        "--devices=sim:0-3",
        timeout=60,
    )
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*--devices names only the platform, e.g. --devices sim*"])


def test_lost_node_gives_infra_then_passes_elsewhere(pytester: pytest.Pytester) -> None:
    # A cluster of its own: the node it loses is not the module's to give back (a node
    # started in a test is the test's, and ended as it ends: docs/leaks.md).
    with two_node_cluster() as cluster:
        _lose_a_node(pytester, cluster)


def _lose_a_node(pytester: pytest.Pytester, cluster: Cluster) -> None:
    out = pytester.path / "out"
    out.mkdir()
    pytester.makepyprojecttoml(PYPROJECT)
    pytester.makepyfile(
        test_slow=f"""
        import os, time
        from pathlib import Path
        import pytest

        OUT = Path({str(out)!r})

        def hold(name):
            node = os.environ["DEVPOOL_RAY_NODE_ID"]
            (OUT / f"{{name}}-{{node}}.started").write_text(node)
            deadline = time.monotonic() + 90
            while not (OUT / "release").exists():
                assert time.monotonic() < deadline, "never released"
                time.sleep(0.05)

        @pytest.mark.device_count({NODE_NPU})
        def test_a():
            hold("a")

        @pytest.mark.device_count({NODE_NPU})
        def test_b():
            hold("b")
        """
    )
    head_id = cluster.head_node.unique_id
    (other,) = [node for node in cluster.list_all_nodes() if node.unique_id != head_id]
    record = pytester.path / "record.jsonl"
    args = [
        *PLUGIN_ARGS,
        "--devpool-backend=ray",
        f"--devpool-ray-address={cluster.address}",
        "--devices=sim",
        f"--devpool-run-record={record}",
        f"--devpool-lock-dir={pytester.path / 'locks'}",
        "--devpool-reruns-infra=1",
    ]
    with open(pytester.path / "stdout", "wb") as stdout_file:
        process = pytester.popen([sys.executable, "-m", "pytest", *args], stdout=stdout_file)
    try:
        wait_until(lambda: len(list(out.glob("*.started"))) == 2, 120, "both tests to start")
        victim = next(
            p.name.split("-")[0] for p in out.glob("*.started") if other.node_id in p.name
        )
        cluster.remove_node(other)
        wait_until(
            lambda: record.exists() and any(e["outcome"] == "infra" for e in job_ends(record)),
            90,
            "the lost node's test to end infra",
        )
        (out / "release").write_text("")
        process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    stdout = (pytester.path / "stdout").read_text()
    assert process.returncode == 0, stdout
    ends = job_ends(record)
    lost = [e for e in ends if e["outcome"] == "infra"]
    assert [e["nodeid"] for e in lost] == [f"test_slow.py::test_{victim}"], ends
    assert lost[0]["retried"] and "lost" in lost[0]["detail"]
    # The rerun passes on the node that is left. A lost machine is not the test's own
    # failure, so that pass is a plain pass, not flaky.
    survivor = "b" if victim == "a" else "a"
    assert outcomes(record) == {
        (f"test_slow.py::test_{victim}", "passed"),
        (f"test_slow.py::test_{survivor}", "passed"),
    }


RING = """
import os
import time
from pathlib import Path
from typing import Any

import pytest

HOLDS = Path({holds!r})


@pytest.mark.device_count(1)
@pytest.mark.resources(hccl=1)
@pytest.mark.parametrize("i", range(4))
def test_ring(i):
    start = time.time()
    time.sleep(0.3)
    line = f"{{os.environ['DEVPOOL_RAY_NODE_ID']}} {{start}} {{time.time()}}\\n"
    fd = os.open(HOLDS, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, line.encode())
    os.close(fd)
"""


def test_two_runs_on_one_cluster_never_hold_a_nodes_ring_at_once(
    pytester: pytest.Pytester, cluster: Cluster
) -> None:
    """resources(hccl=1) is Ray's custom resource, held across every run on the cluster:
    two concurrent runs' ring holds on one node never overlap, and both end green."""
    holds = pytester.path / "holds.txt"
    runs = []
    for k in range(2):
        root = pytester.path / f"run{k}"
        root.mkdir()
        (root / "pyproject.toml").write_text(PYPROJECT + "\n[tool.devpool.resources]\nhccl = 2\n")
        (root / "test_ring.py").write_text(RING.format(holds=str(holds)))
        runs.append(root)
    procs = [start_session(cluster, root) for root in runs]
    try:
        outputs = [proc.communicate(timeout=240)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, output in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, output
        assert "4 passed" in output, output
    spans: dict[str, list[tuple[float, float]]] = {}
    for line in holds.read_text().splitlines():
        node, start, end = line.split()
        spans.setdefault(node, []).append((float(start), float(end)))
    assert sum(len(v) for v in spans.values()) == 8
    for node, held in spans.items():
        held.sort()
        overlaps = [(a, b) for a, b in zip(held, held[1:], strict=False) if b[0] < a[1]]
        assert overlaps == [], (node, overlaps)


def test_a_resource_the_cluster_does_not_declare_is_refused_with_the_ray_start_line(
    pytester: pytest.Pytester, cluster: Cluster
) -> None:
    pytester.makepyprojecttoml(PYPROJECT + "\n[tool.devpool.resources]\nlicense = 1\n")
    pytester.makepyfile(
        test_license="""
        import pytest

        @pytest.mark.resources(license=1)
        def test_needs_a_license():
            pass
        """
    )
    record = pytester.path / "record.jsonl"
    result = run_ray(pytester, cluster, record)
    out = result.stdout.str()
    assert result.ret == 1, out
    assert "needs the custom resource 'license'" in out, out
    assert "ray start --resources='{\"license\": 1}'" in out, out


def start_session(cluster: Cluster, root: Path) -> subprocess.Popen[str]:
    """A devpool session on the cluster in root, in a process group of its own (to SIGKILL)."""
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", *PLUGIN_ARGS, *ray_args(cluster)]
        + [f"--devpool-lock-dir={root / 'locks'}", "-q"],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


HOLD_RING = """
import os
import time
from pathlib import Path
from typing import Any

import pytest

OUT = Path({out!r})


@pytest.mark.device_count(1)
@pytest.mark.resources(hccl=1)
@pytest.mark.parametrize("i", range(2))
def test_holds_the_ring(i):
    (OUT / f"held-{{i}}").write_text(os.environ["DEVPOOL_RAY_NODE_ID"])
    time.sleep(120)
"""


def test_a_sigkilled_runs_ring_comes_back_and_the_other_run_finishes_green(
    pytester: pytest.Pytester, cluster: Cluster
) -> None:
    """Ray gives a dead driver's actors' custom resources back: the run waiting for both
    nodes' rings gets them once the holder is SIGKILLed, and ends green."""
    out = pytester.path / "out"
    out.mkdir()
    roots = []
    bodies = {
        "holder": HOLD_RING.format(out=str(out)),
        "waiter": RING.format(holds=str(pytester.path / "holds.txt")),
    }
    for name, body in bodies.items():
        root = pytester.path / name
        root.mkdir()
        (root / "pyproject.toml").write_text(PYPROJECT + "\n[tool.devpool.resources]\nhccl = 2\n")
        (root / "test_ring.py").write_text(body)
        roots.append(root)

    holder = start_session(cluster, roots[0])
    waiter = None
    try:
        wait_until(lambda: len(list(out.glob("held-*"))) == 2, 120, "both rings held")
        waiter = start_session(cluster, roots[1])
        records = roots[1] / ".devpool" / "runs"

        def asked() -> bool:  # its first rings asked of Ray (queued behind the held ones)
            return any("job_start" in r.read_text() for r in records.glob("*/record.jsonl"))

        wait_until(asked, 120, "the waiter to ask Ray for a ring")
        assert waiter.poll() is None
        assert not any("job_end" in r.read_text() for r in records.glob("*/record.jsonl"))
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
        output = waiter.communicate(timeout=180)[0]
    finally:
        for proc in (holder, waiter):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert waiter.returncode == 0, output
    assert "4 passed" in output, output


SPANS = """
import os
import time
from pathlib import Path
from typing import Any

import pytest

SPANS = Path({spans!r})


@pytest.mark.device_count(1)
@pytest.mark.parametrize("i", range({count}))
def test_step(i):
    start = time.time()
    time.sleep({seconds})
    fd = os.open(SPANS, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, f"{{start}} {{time.time()}}\\n".encode())
    os.close(fd)
"""


def test_two_runs_on_one_cluster_share_its_devices(
    pytester: pytest.Pytester, cluster: Cluster
) -> None:
    """Fair share on a cluster (ray/waiting.py): a run started while another holds every
    device with a long stream of one-device tests gets its share within seconds, not once
    the first run is done; both end green."""
    shapes = {"first": (96, 1.5), "second": (16, 0.5)}
    roots = {}
    for name, (count, seconds) in shapes.items():
        root = pytester.path / name
        root.mkdir()
        (root / "pyproject.toml").write_text(PYPROJECT)
        spans = pytester.path / f"{name}.spans"
        (root / "test_steps.py").write_text(
            SPANS.format(spans=str(spans), count=count, seconds=seconds)
        )
        roots[name] = root

    def spans(name: str) -> list[tuple[float, float]]:
        path = pytester.path / f"{name}.spans"
        if not path.exists():
            return []
        return [tuple(map(float, line.split())) for line in path.read_text().splitlines()]  # type: ignore[misc]

    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        procs["first"] = start_session(cluster, roots["first"])
        wait_until(lambda: len(spans("first")) >= 8, 180, "the first run to hold the devices")
        procs["second"] = start_session(cluster, roots["second"])
        seen = locks_while_waiting(cluster, procs["second"])
        outputs = {name: proc.communicate(timeout=300)[0] for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    for name, proc in procs.items():
        assert proc.returncode == 0, outputs[name]
        assert f"{shapes[name][0]} passed" in outputs[name], outputs[name]
    first_end = max(end for _, end in spans("first"))
    second_start = min(start for start, _ in spans("second"))
    # Without a share the second run's actors wait in Ray's queue until the first run's
    # warm workers end with its last test: its 8 device-seconds would all come after the
    # first run's 144. With it, the second run's tests start while the first still runs.
    # (Not "ends first": on a loaded host its start-up can outlast the first run's tail.)
    assert second_start < first_end, (second_start, first_end, outputs["second"])
    # `devpool locks --ray-address` showed the first run's workers on the nodes, and the
    # second run waiting for its share.
    [first_run] = [p.name for p in (roots["first"] / ".devpool" / "runs").iterdir()]
    [second_run] = [p.name for p in (roots["second"] / ".devpool" / "runs").iterdir()]
    assert f"run {first_run} (host " in seen, seen
    assert "runs waiting for a fair share:" in seen and f"run {second_run} (pid " in seen, seen


def locks_while_waiting(cluster: Cluster, waiter: subprocess.Popen[str]) -> str:
    """What `devpool locks --ray-address` says once it shows a run waiting for a share."""
    command = [sys.executable, "-m", "devpool.cli", "locks", f"--ray-address={cluster.address}"]
    deadline = time.monotonic() + 90
    output = ""
    while time.monotonic() < deadline and waiter.poll() is None:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        output = done.stdout + done.stderr
        assert done.returncode == 0, output
        if "runs waiting for a fair share:" in output:
            return output
    return output


def test_devpool_locks_takes_a_lock_folder_or_a_cluster_not_both(cluster: Cluster) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "devpool.cli", "locks", "--lock-dir=/tmp", "--ray-address"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 4, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        "devpool: error: give --lock-dir or --ray-address, not both"
    ], done.stderr


def test_devpool_locks_on_a_cluster_without_its_dashboard_is_one_sentence() -> None:
    """Ray's state API is served by the dashboard: a cluster without one gets a sentence
    naming that, not Ray's traceback."""
    with two_node_cluster() as bare:
        done = subprocess.run(
            [sys.executable, "-m", "devpool.cli", "locks", f"--ray-address={bare.address}"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    said = [line for line in done.stderr.splitlines() if line.startswith("devpool: error:")]
    assert done.returncode == 4, done.stdout + done.stderr
    assert len(said) == 1 and "dashboard" in said[0], done.stderr
    assert "Traceback" not in done.stderr, done.stderr


WHO_AM_I = """
import json
import os
from pathlib import Path
from typing import Any

import pytest

OUT = Path({out!r})
{conftest_thread}

def record(name):
    ppid = os.getppid()
    OUT.joinpath(f"{{name}}-{{os.environ.get('DEVPOOL_NODE_RANK', '0')}}.json").write_text(
        json.dumps(dict(
            node=os.environ["DEVPOOL_RAY_NODE_ID"],
            parent=ppid,
            parent_comm=Path(f"/proc/{{ppid}}/comm").read_text().strip(),
            devices=os.environ["DEVPOOL_DEVICES"],
        ))
    )


@pytest.mark.device_count(1)
@pytest.mark.parametrize("i", range(4))
def test_one(i):
    record(f"one{{i}}")


@pytest.mark.nodes(2)
@pytest.mark.device_count(1)
def test_pair():
    record("pair")
"""


def _who(out: Path) -> dict[str, dict[str, Any]]:
    return {path.stem: json.loads(path.read_text()) for path in out.glob("*.json")}


def test_ranks_fork_from_their_nodes_templates(pytester: pytest.Pytester, cluster: Cluster) -> None:
    """Every rank's worker is a fork of its own node's template of its kind (both ranks of
    a nodes(2) test too), and the templates end with the run; --devpool-no-fork-server
    starts fresh interpreters, with the same outcomes."""
    out = pytester.path / "out"
    out.mkdir()
    pytester.makepyprojecttoml(PYPROJECT)
    pytester.makepyfile(test_who=WHO_AM_I.format(out=str(out), conftest_thread=""))
    record = pytester.path / "record.jsonl"
    forked = run_ray(pytester, cluster, record)
    assert forked.ret == 0, forked.stdout.str()
    seen = _who(out)
    assert sorted(seen) == ["one0-0", "one1-0", "one2-0", "one3-0", "pair-0", "pair-1"]
    assert {who["parent_comm"] for who in seen.values()} == {"devpool-tmpl"}, seen
    # One template per node and kind: the one-device tests on a node fork from one, and
    # the two ranks of the pair (a kind of its own: 2 devices in all) from one per node.
    ones: dict[str, set[int]] = {}
    for name, who in seen.items():
        if name.startswith("one"):
            ones.setdefault(who["node"], set()).add(who["parent"])
    assert all(len(parents) == 1 for parents in ones.values()), seen
    assert seen["pair-0"]["node"] != seen["pair-1"]["node"]
    assert seen["pair-0"]["parent"] != seen["pair-1"]["parent"]
    templates = {who["parent"] for who in seen.values()}
    wait_until(lambda: not any(alive(pid) for pid in templates), 30, "the templates to end")
    fresh_record = pytester.path / "fresh.jsonl"
    shutil.rmtree(out)
    out.mkdir()
    fresh = run_ray(pytester, cluster, fresh_record, "--devpool-no-fork-server")
    assert fresh.ret == 0, fresh.stdout.str()
    assert "devpool-tmpl" not in {who["parent_comm"] for who in _who(out).values()}
    assert outcomes(fresh_record) == outcomes(record)


def test_a_node_template_that_may_not_fork_says_so_and_its_ranks_start_fresh(
    pytester: pytest.Pytester, cluster: Cluster
) -> None:
    out = pytester.path / "out"
    out.mkdir()
    pytester.makepyprojecttoml(PYPROJECT)
    # A thread started at import: a fork could inherit a lock it holds.
    thread = (
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
    )
    pytester.makepyfile(test_who=WHO_AM_I.format(out=str(out), conftest_thread=thread))
    record = pytester.path / "record.jsonl"
    result = run_ray(pytester, cluster, record)
    assert result.ret == 0, result.stdout.str()
    seen = _who(out)
    assert len(seen) == 6 and "devpool-tmpl" not in {w["parent_comm"] for w in seen.values()}
    result.stdout.fnmatch_lines(
        ["*fork server for 1-device workers off on node *: *1 thread(s) besides the main one*"]
    )


ONCE_CONFTEST = """
import json, os, socket, subprocess, sys, time
from pathlib import Path

import pytest

OUT = Path({out!r})


def note(key, **data):
    data.update(pid=os.getpid(), node=os.environ.get("DEVPOOL_RAY_NODE_ID"), at=time.time(),
                devices=os.environ.get("DEVPOOL_DEVICES"))
    with open(OUT / (key + ".jsonl"), "a") as handle:
        handle.write(json.dumps(data) + "\\n")

{server}

@pytest.fixture(scope="session")
def server():
    port = int(os.environ["DEVPOOL_PORTS"].split(",")[0])
    proc = start_server(port)
    note("setup", port=port, server=proc.pid)
    yield dict(port=port, server=proc.pid, node=os.environ.get("DEVPOOL_RAY_NODE_ID"),
               devices=os.environ.get("DEVPOOL_DEVICES"))
    proc.terminate()
    proc.wait()
    note("teardown")
"""

ONCE_USERS = """
import socket, time

import pytest
from conftest import note


@pytest.mark.device_count(1)
@pytest.mark.parametrize("i", range(10))
def test_uses(server, i):
    time.sleep(0.3)
    with socket.create_connection(("127.0.0.1", server["port"]), timeout=10) as conn:
        said = conn.recv(5).decode()
    note("test", i=i, server=server, said=said, end=time.time())


def test_beside():
    note("beside")
"""


def test_a_once_fixture_runs_once_on_a_node_that_holds_its_request(
    pytester: pytest.Pytester, cluster: Cluster
) -> None:
    """[tool.devpool.once] on Ray (issue 57): the fixture is set up once, in a process Ray
    placed with its device and port; its value reaches the workers through the controller
    (no shared folder); no test gets its device while it is up; torn down after its last
    user, and nothing of it outlives the run. (The loopback cluster shares one disk: the
    check that no outcome file was written stands in for nodes that share none.)"""
    out = pytester.path / "out"
    out.mkdir()
    pytester.makepyprojecttoml(
        PYPROJECT + "[tool.devpool.once]\nserver = { device_count = 1, ports = 1 }\n"
    )
    pytester.makeconftest(ONCE_CONFTEST.format(out=str(out), server=PORT_SERVER))
    pytester.makepyfile(test_users=ONCE_USERS)
    record = pytester.path / "record.jsonl"
    result = run_ray(pytester, cluster, record, "-p", "no:randomly")
    text = result.stdout.str()
    assert result.ret == 0, text
    assert "12 passed" not in text and "11 passed" in text, text

    def lines(key: str) -> list[dict[str, Any]]:
        path = out / f"{key}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    [setup], [teardown] = lines("setup"), lines("teardown")
    tests = lines("test")
    assert sorted(t["i"] for t in tests) == list(range(10))
    workers = {t["pid"] for t in tests}
    assert len(workers) > 1 and setup["pid"] not in workers, (workers, setup)
    for test in tests:
        assert test["said"] == "hello" and test["server"]["server"] == setup["server"]
        # Its device is its own while it is up: no user ran on it.
        assert (test["node"], test["devices"]) != (setup["node"], setup["devices"]), test
    assert teardown["pid"] == setup["pid"]
    assert teardown["at"] >= max(t["end"] for t in tests)  # after its last user
    assert not alive(int(setup["pid"])) and not alive(int(setup["server"]))
    # The value travelled with the batches, not through a file beside the controller.
    assert not list(pytester.path.glob(".devpool/runs/*/once/server.pickle"))
    events = [json.loads(line) for line in record.read_text().splitlines() if line.strip()]
    [up] = [e for e in events if e["type"] == "once_setup"]
    assert up["outcome"] == "value"
    assert [e for e in events if e["type"] == "once_teardown"]
    assert "ONCE server set up in" in text and "ONCE server torn down in" in text
    assert "ordinary ones" not in text, text


ONCE_KILLED = """
import os, signal, time
from pathlib import Path

import pytest

RECORD = Path({record!r})


@pytest.fixture(scope="session")
def server():
    yield os.getpid()


def test_a_kill(server):
    os.kill(server, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while "once_lost" not in RECORD.read_text():
        assert time.monotonic() < deadline, "the run never saw its once-fixture lost"
        time.sleep(0.1)


@pytest.mark.parametrize("i", range(3))
def test_b_after(server, i):
    pass


def test_c_other():
    pass
"""

ONCE_FAILING = """
import pytest


@pytest.fixture(scope="session")
def server():
    raise RuntimeError("no server today")


@pytest.mark.parametrize("i", range(3))
def test_uses(server, i):
    pass


def test_other():
    pass
"""


def test_a_once_fixture_on_ray_that_dies_or_fails_ends_its_users_as_on_a_host(
    pytester: pytest.Pytester, cluster: Cluster
) -> None:
    """A once-process SIGKILLed mid-run: its remaining users end infra, naming it, the
    others pass. A setup that raises: the outcomes equal plain pytest's. (A test kills the
    fixture's process by its pid: the loopback cluster's nodes share this host.)"""
    once = "[tool.devpool.once]\nserver = { device_count = 1 }\n"
    pytester.makepyprojecttoml(PYPROJECT + once)
    record = pytester.path / "killed.jsonl"
    pytester.makepyfile(test_killed=ONCE_KILLED.format(record=str(record)))
    args = ("-p", "no:randomly", "--devpool-max-parallel=1", "-rA")
    result = run_ray(pytester, cluster, record, *args, "test_killed.py")
    text = result.stdout.str()
    assert "2 passed, 3 infra" in text, text
    for i in range(3):
        assert f"INFRA test_killed.py::test_b_after[{i}] - once-fixture server's process" in text

    pytester.makepyfile(test_failing=ONCE_FAILING)
    junit = {"plain": pytester.path / "plain.xml", "ray": pytester.path / "ray.xml"}
    pytester.runpytest_subprocess(
        "-p", "no:devpool", "-p", "no:randomly", f"--junitxml={junit['plain']}",
        "test_failing.py", timeout=120,
    )  # fmt: skip
    run_ray(pytester, cluster, pytester.path / "failing.jsonl", *args,
            f"--junitxml={junit['ray']}", "test_failing.py")  # fmt: skip

    def cases(path: Path) -> dict[str, tuple[str, str]]:
        found = {}
        for case in ET.parse(path).iter("testcase"):
            kinds = [c for c in case if c.tag in ("failure", "error", "skipped")]
            message = "".join(str(c.get("message", "")) for c in kinds)
            found[str(case.get("name"))] = (",".join(c.tag for c in kinds) or "passed", message)
        return found

    plain = cases(junit["plain"])
    assert plain["test_uses[0]"][0] == "error" and plain["test_other"][0] == "passed"
    assert cases(junit["ray"]) == plain
