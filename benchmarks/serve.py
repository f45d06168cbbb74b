"""`devpool serve` cost: page render time and server RSS on a busy host (issue 23).

Synthesises a lock folder of 64 devices (40 held by this process for 20 live runs, 4 of
them shared by memory), 20 live run records (this process's pid, no session_end), 200
finished run records of 100 tests each and a duration history of 500 tests x 20 runs;
then starts `devpool serve` over it and times GET / and /api/v1/overview (the first, and
the median of the next --repeat), and reads the server's RSS (VmRSS and peak VmHWM).
Target: a page in under 200 ms, the server under 80 MB RSS.

With --ray gcs|dashboard it also starts a two-node Ray cluster on loopback (its dashboard
serves Ray's state API) and shows it with --ray-address: its GCS address (read through
Ray's client) or its dashboard URL (read over HTTP): the Ray view's cost, in time and RSS,
beside the same host without it (run them one after the other).

    python benchmarks/serve.py [--repeat 20] [--ray gcs|dashboard] [--devpool-src PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _rss(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process, in MB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


def _port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def synthesise(root: Path) -> tuple[Path, Path, list[object]]:
    """The lock folder, the project's .devpool folder, and the leases held (keep them)."""
    from devpool.devices.leases import Holder
    from devpool.devices.lockdir import LockDir
    from devpool.history.durations import History, TestResult
    from devpool.report.record import RecordWriter

    host = os.uname().nodename
    folder = root / "proj" / ".devpool"
    locks = LockDir(root / "locks")
    leases: list[object] = []
    now = time.time()
    for device in range(64):
        locks.lock_path("sim", device).touch()
    for run in range(20):
        run_id = f"20261201-1000{run:02d}-{90000 + run}"
        writer = RecordWriter(folder / "runs" / run_id / "record.jsonl")
        writer.write("session_start", run_id=run_id, host=host, pid=os.getpid(),
                     platform="sim", devices=list(range(64)), tests=50)  # fmt: skip
        for job in range(30):
            nodeid = f"tests/test_live{run}.py::test_{job}[<b>{job}</b>]"
            writer.write("job_start", job=job, nodeid=nodeid, devices=[job % 64], log="")
            if job < 28:
                writer.write("job_end", job=job, nodeid=nodeid, devices=[job % 64],
                             outcome="failed" if job % 9 == 0 else "passed",
                             tail=["E   assert 1 == 2"] * 5)  # fmt: skip
        writer.close()
        for device in (2 * run, 2 * run + 1):
            job = f"tests/test_live{run}.py::test_{device}"
            holder = Holder(os.getpid(), host, run_id, job, now - 30, "ci")
            if run < 2:
                capacity = {device: 80 << 30}
                lease = locks.try_acquire_memory("sim", [device], 8 << 30, capacity, holder)
            else:
                lease = locks.try_acquire("sim", [device], holder)
            assert not isinstance(lease, list), lease
            leases.append(lease)
    results = []
    for run in range(200):
        run_id = f"20261130-{run:06d}-{10000 + run}"
        writer = RecordWriter(folder / "runs" / run_id / "record.jsonl")
        writer.write("session_start", run_id=run_id, host=host, pid=1, platform="sim",
                     devices=list(range(8)), tests=100)  # fmt: skip
        for job in range(100):
            nodeid = f"tests/test_mod{job // 10}.py::test_{job}"
            outcome = "failed" if (job + run) % 37 == 0 else "passed"
            writer.write("job_start", job=job, nodeid=nodeid, devices=[job % 8], log="")
            writer.write("job_end", job=job, nodeid=nodeid, devices=[job % 8], outcome=outcome)
            if run % 10 == 0 and job < 500:
                results.append(TestResult(nodeid, outcome, 0.5, "sim", 1 + job % 4,
                                          "sim-8", now - run, run_id))  # fmt: skip
        writer.write("session_end", exitstatus=1 if run % 5 else 0)
        writer.close()
    for test in range(500):
        for run in range(20):
            outcome = "flaky" if (test % 50 == 0 and run % 3 == 0) else "passed"
            results.append(TestResult(f"tests/test_h{test // 20}.py::test_{test}", outcome,
                                      0.1 + test % 7, "sim", 1 + test % 8, "sim-8",
                                      now - 1000 + run, f"h{run}"))  # fmt: skip
    with History(folder / "history.sqlite") as history:
        history.add(results)
    return locks.path, folder, leases


def _get(url: str) -> tuple[float, int]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as answer:
        size = len(answer.read())
    return (time.perf_counter() - started) * 1000, size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--devpool-src", default=str(HERE.parent / "src"))
    parser.add_argument(
        "--ray", choices=("gcs", "dashboard"), help="show a loopback Ray cluster too, by it"
    )
    args = parser.parse_args()
    sys.path.insert(0, args.devpool_src)
    with contextlib.ExitStack() as stack:
        extra = []
        if args.ray:
            gcs, dashboard = stack.enter_context(_ray_cluster())
            address = gcs if args.ray == "gcs" else dashboard
            extra = [f"--ray-address={address}"]
            print(f"Ray cluster at {address}", flush=True)
        _measure(args, extra)
    return 0


@contextlib.contextmanager
def _ray_cluster() -> Iterator[tuple[str, str]]:
    """Two loopback nodes of 4 NPU; the head serves Ray's dashboard (its state API).
    Its GCS address and its dashboard URL."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from ray.cluster_utils import Cluster

    head = {"num_cpus": 1, "resources": {"NPU": 4}, "include_dashboard": True}
    head.update(dashboard_host="127.0.0.1", dashboard_port=_port())
    cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        cluster.add_node(num_cpus=1, resources={"NPU": 4})
        cluster.wait_for_nodes()
        yield str(cluster.address), "http://" + cluster.head_node.address_info["webui_url"]
    finally:
        cluster.shutdown()


def _measure(args: argparse.Namespace, extra: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="devpool-serve-bench-") as temp:
        root = Path(temp)
        started = time.perf_counter()
        lock_dir, folder, leases = synthesise(root)
        print(f"synthesised in {time.perf_counter() - started:.1f} s", flush=True)
        port = _port()
        env = dict(os.environ, PYTHONPATH=args.devpool_src)
        argv = [sys.executable, "-m", "devpool.cli", "serve", "--port", str(port), *extra]
        server = subprocess.Popen([*argv, f"--lock-dir={lock_dir}", str(folder)], env=env)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline, "devpool serve did not listen"
                    time.sleep(0.05)
            idle_rss, _ = _rss(server.pid)
            if extra:  # the Ray view answers in the background: wait for its first answer
                while not json.loads(urllib.request.urlopen(base + "/api/v1/ray").read())[
                    "clusters"
                ][0]["nodes"]:
                    assert time.monotonic() < deadline + 60, "the Ray view never answered"
                    time.sleep(0.2)
            for path in ("/", "/api/v1/overview"):
                first, size = _get(base + path)
                warm = [_get(base + path)[0] for _ in range(args.repeat)]
                median = statistics.median(warm)
                print(
                    f"GET {path:18} first {first:6.0f} ms, then median {median:5.0f} ms"
                    f" (min {min(warm):.0f}, max {max(warm):.0f}), {size / 1024:.0f} KiB"
                )
            rss, peak = _rss(server.pid)
            print(f"server RSS: {idle_rss:.0f} MB idle, {rss:.0f} MB after, peak {peak:.0f} MB")
        finally:
            server.terminate()
            server.wait(timeout=10)
            for lease in leases:
                lease.release()  # type: ignore[attr-defined]


if __name__ == "__main__":
    sys.exit(main())
