"""End to end: `@pytest.mark.ranks(n)` runs a test as n processes, one per rank (issue 36).

The rank machinery needs no torch: the ranks of these suites meet through their leased
MASTER_PORT (rank 0 listens, the others connect), as a process group's rendezvous would.
Each test writes what its rank saw; the run's terminal, record and JUnit are what is read.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devpool.devices.leases import Holder, Lease
from devpool.devices.lockdir import LockDir

MEET = """
import json
import os
import socket
import time
from pathlib import Path

import pytest


def meet():
    '''Every rank reaches rank 0 through MASTER_PORT; rank 0 answers each. A barrier.'''
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    port = int(os.environ["MASTER_PORT"])
    if rank == 0:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen(world)
        peers = [server.accept()[0] for _ in range(world - 1)]
        # Closed before any rank goes on: a rank's next meet() must find no listener (and
        # retry) rather than wait in this one's backlog until it is closed under it.
        server.close()
        for peer in peers:
            peer.recv(8)
            peer.sendall(b"go")
            peer.close()
        return
    deadline = time.monotonic() + 30
    while True:
        try:
            peer = socket.create_connection(("127.0.0.1", port))
            break
        except OSError:
            assert time.monotonic() < deadline, "rank 0 never listened"
            time.sleep(0.02)
    peer.sendall(str(rank).encode())
    assert peer.recv(2) == b"go"
    peer.close()


def seen(name):
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
            "MASTER_ADDR", "MASTER_PORT", "DEVPOOL_DEVICES", "DEVPOOL_RANK_DEVICES",
            "DEVPOOL_SIM_VISIBLE_DEVICES")
    data = {k: os.environ.get(k) for k in keys}
    data["pid"] = os.getpid()
    Path(f"seen-{name}-{os.environ['RANK']}.json").write_text(json.dumps(data))
"""


def run(root: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVPOOL_", "PYTEST_"))}
    env.pop("MASTER_PORT", None)
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "devpool.plugin", "-p", "no:cacheprovider"]
        + [f"--devpool-lock-dir={root / 'locks'}", f"--devpool-run-dir={root / 'run'}"]
        + [f"--junitxml={root / 'junit.xml'}", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def job_ends(root: Path) -> dict[str, dict[str, Any]]:
    """The last job_end of each test in the run record."""
    ends: dict[str, dict[str, Any]] = {}
    for line in (root / "run" / "record.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["type"] == "job_end":
            ends[event["test"].split("::")[-1]] = event
    return ends


def seen(root: Path, name: str, rank: int) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((root / f"seen-{name}-{rank}.json").read_text())
    return data


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for every purpose here
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def assert_nothing_left(root: Path, devices: int = 0) -> None:
    """No rank process alive, no device lease held, the leased ports free again."""
    ends = job_ends(root)
    pids = {rank["pid"] for end in ends.values() for rank in end.get("ranks", ())}
    assert pids, ends
    bound = time.monotonic() + 10
    while time.monotonic() < bound and any(_alive(pid) for pid in pids):
        time.sleep(0.05)
    assert not [pid for pid in pids if _alive(pid)]
    if devices:
        locks = LockDir(root / "locks")
        got = locks.try_acquire("sim", list(range(devices)), Holder.for_this_process("check"))
        assert isinstance(got, Lease), f"a lease is still held: {got}"
        got.release()
    for port in {p for end in ends.values() for p in end.get("ports", ())}:
        with socket.socket() as sock:  # rank 0 listened on it: nothing may hold it now
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))


def test_every_rank_gets_torchruns_environment_and_its_own_device(tmp_path: Path) -> None:
    (tmp_path / "test_env.py").write_text(
        MEET
        + """
@pytest.mark.ranks(2)
def test_two(devpool_rank):
    seen("two")
    meet()
    assert devpool_rank.world_size == 2 and devpool_rank.local_rank == devpool_rank.rank
    assert len(devpool_rank.devices) == 1


@pytest.mark.ranks(2, devices_per_rank=2)
def test_two_by_two(devpool_rank):
    seen("wide")
    meet()
    assert len(devpool_rank.devices) == 2
"""
    )
    done = run(tmp_path, "--devices", "sim:0-3")
    assert done.returncode == 0, done.stdout + done.stderr
    for name, per_rank in (("two", 1), ("wide", 2)):
        ranks = [seen(tmp_path, name, rank) for rank in (0, 1)]
        visible = ranks[0]["DEVPOOL_DEVICES"].split(",")
        assert len(visible) == 2 * per_rank
        for rank, data in enumerate(ranks):
            assert data["RANK"] == data["LOCAL_RANK"] == str(rank)
            assert data["WORLD_SIZE"] == data["LOCAL_WORLD_SIZE"] == "2"
            assert data["GROUP_RANK"] == "0" and data["MASTER_ADDR"] == "127.0.0.1"
            # Every rank sees the test's devices in rank order: device LOCAL_RANK is its own.
            assert data["DEVPOOL_DEVICES"] == ranks[0]["DEVPOOL_DEVICES"]
            own = visible[rank * per_rank : (rank + 1) * per_rank]
            assert data["DEVPOOL_RANK_DEVICES"].split(",") == own
        assert ranks[0]["MASTER_PORT"] == ranks[1]["MASTER_PORT"]
        assert ranks[0]["pid"] != ranks[1]["pid"]
    # The two tests held their devices at once or one after the other, never shared.
    ends = job_ends(tmp_path)
    assert [r["outcome"] for r in ends["test_two"]["ranks"]] == ["passed", "passed"]
    assert len(ends["test_two_by_two"]["devices"]) == 4
    # JUnit: one testcase per test, not one per rank.
    cases = [c.get("name") for c in ET.parse(tmp_path / "junit.xml").getroot().iter("testcase")]
    assert sorted(cases) == ["test_two", "test_two_by_two"]
    assert_nothing_left(tmp_path, devices=4)


FAULTS = """
@pytest.mark.ranks(2, devices_per_rank=0)
def test_fails_on_rank_1():
    if os.environ["RANK"] == "1":
        assert 1 == 2, "rank one disagrees"
    meet()  # rank 0 waits here for a rank that will never come


@pytest.mark.ranks(2, devices_per_rank=0)
def test_dies_on_rank_1():
    if os.environ["RANK"] == "1":
        os._exit(7)
    meet()


@pytest.mark.ranks(2, devices_per_rank=0)
@pytest.mark.timeout(4)
def test_stalls_on_rank_0():
    if os.environ["RANK"] == "0":
        time.sleep(300)


@pytest.mark.ranks(2, devices_per_rank=0)
def test_skips_on_rank_1_only():
    if os.environ["RANK"] == "1":
        pytest.skip("no second card here")
    meet()


@pytest.mark.ranks(2, devices_per_rank=0)
def test_skips_everywhere():
    pytest.skip("not on this host")


@pytest.mark.ranks(2, devices_per_rank=0)
@pytest.mark.parametrize("n", range(3))
def test_passes(n):
    seen(f"passes{n}")
    meet()
"""


def test_a_failing_a_dying_and_a_stalled_rank_each_end_their_test_alone(tmp_path: Path) -> None:
    (tmp_path / "test_faults.py").write_text(MEET + FAULTS)
    started = time.monotonic()
    done = run(tmp_path, "--devices", "auto", "-p", "no:randomly", "--devpool-reruns=0")
    took = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert took < 60, f"the file took {took:.0f}s"
    ends = job_ends(tmp_path)
    outcomes = {name: end["outcome"] for name, end in ends.items()}
    assert outcomes == {
        "test_fails_on_rank_1": "failed",
        "test_dies_on_rank_1": "crashed",
        "test_stalls_on_rank_0": "timeout",
        "test_skips_on_rank_1_only": "failed",
        "test_skips_everywhere": "skipped",
        "test_passes[0]": "passed",
        "test_passes[1]": "passed",
        "test_passes[2]": "passed",
    }, output
    # Each ending names its rank.
    failed = ends["test_fails_on_rank_1"]
    assert [r["outcome"] for r in failed["ranks"]] == ["ended", "failed"]
    assert "rank 1: AssertionError: rank one disagrees" in output
    assert "[rank 0] ended: rank 1 failed" in output
    assert "rank 1 (pid" in ends["test_dies_on_rank_1"]["detail"]
    assert "exited with code 7" in ends["test_dies_on_rank_1"]["detail"]
    assert "skipped on rank 1 only, ran on rank 0" in output
    stall = ends["test_stalls_on_rank_0"]
    assert "exceeded its 4s limit" in stall["detail"]
    # The stalled rank's line is on screen, labelled; the rank that finished says so.
    assert "[rank 0] pid" in output and "time.sleep(300)" in output
    assert "[rank 1] pid" in output and "had finished the test" in output
    # A failure's group is not the next test's: the passing tests ran in fresh ranks, and
    # those three shared one warm group (the same processes, the same port).
    first = {int(seen(tmp_path, "passes0", r)["pid"]) for r in (0, 1)}
    assert first.isdisjoint(r["pid"] for r in failed["ranks"])
    for n in (1, 2):
        assert {int(seen(tmp_path, f"passes{n}", r)["pid"]) for r in (0, 1)} == first
    assert_nothing_left(tmp_path)


def test_the_other_ranks_are_ended_within_two_seconds_of_a_failure(tmp_path: Path) -> None:
    (tmp_path / "test_fast.py").write_text(
        MEET
        + """
@pytest.mark.ranks(3, devices_per_rank=0)
def test_one_fails_two_wait():
    if os.environ["RANK"] == "2":
        time.sleep(0.5)
        assert False
    time.sleep(600)
"""
    )
    done = run(tmp_path, "--devices", "auto")
    assert done.returncode == 1, done.stdout + done.stderr
    end = job_ends(tmp_path)["test_one_fails_two_wait"]
    assert end["outcome"] == "failed"
    assert [r["outcome"] for r in end["ranks"]] == ["ended", "ended", "failed"]
    assert end["end"] - end["start"] < 0.5 + 2.0 + 1.0, end  # the failure, the grace, slack


@pytest.mark.parametrize("isolation", ["worker", "module", "job"])
def test_a_group_is_reused_only_where_the_isolation_allows(tmp_path: Path, isolation: str) -> None:
    (tmp_path / "test_a.py").write_text(
        MEET
        + """
@pytest.mark.ranks(2, devices_per_rank=0)
@pytest.mark.parametrize("n", range(2))
def test_a(n):
    seen(f"a{n}")
    meet()
"""
    )
    (tmp_path / "test_b.py").write_text(
        MEET
        + """
@pytest.mark.ranks(2, devices_per_rank=0)
def test_b():
    seen("b")
    meet()


@pytest.mark.ranks(2, devices_per_rank=0)
@pytest.mark.isolate
def test_b_alone():
    seen("alone")
    meet()
"""
    )
    done = run(
        tmp_path, "--devices", "auto", "-p", "no:randomly", f"--devpool-isolation={isolation}"
    )
    assert done.returncode == 0, done.stdout + done.stderr

    def pids(name: str) -> set[int]:
        return {int(seen(tmp_path, name, rank)["pid"]) for rank in (0, 1)}

    same_module = pids("a0") == pids("a1")
    across_modules = pids("a1") == pids("b")
    assert same_module == (isolation != "job")
    assert across_modules == (isolation == "worker")
    assert pids("alone").isdisjoint(pids("a0") | pids("a1") | pids("b"))
    assert_nothing_left(tmp_path)


def test_a_rank_group_is_not_an_ordinary_device_worker(tmp_path: Path) -> None:
    """A ranks(2) test and a device_count(2) test never share a warm worker."""
    (tmp_path / "test_mix.py").write_text(
        MEET
        + """
@pytest.mark.ranks(2)
def test_ranks():
    seen("ranks")
    meet()


@pytest.mark.device_count(2)
def test_plain():
    Path("plain.json").write_text(json.dumps({"pid": os.getpid(), "rank": os.environ.get("RANK")}))
"""
    )
    done = run(tmp_path, "--devices", "sim:0-1", "-p", "no:randomly")
    assert done.returncode == 0, done.stdout + done.stderr
    plain = json.loads((tmp_path / "plain.json").read_text())
    assert plain["rank"] is None
    assert plain["pid"] not in {int(seen(tmp_path, "ranks", r)["pid"]) for r in (0, 1)}


@pytest.mark.parametrize(
    ("marker", "said"),
    [
        ("ranks(0)", "@pytest.mark.ranks(0) needs a whole number ≥ 1"),
        ("ranks(-1)", "@pytest.mark.ranks(-1) needs a whole number ≥ 1"),
        ("ranks('2')", "@pytest.mark.ranks('2') needs a whole number ≥ 1"),
        ("ranks(1.5)", "@pytest.mark.ranks(1.5) needs a whole number ≥ 1"),
        ("ranks(2, devices_per_rank=-1)", "devices_per_rank=-1) needs a whole number ≥ 0"),
        ("ranks(2, per_rank=1)", "takes a number of ranks and devices_per_rank="),
    ],
)
def test_bad_ranks_markers_get_one_sentence(tmp_path: Path, marker: str, said: str) -> None:
    (tmp_path / "test_bad.py").write_text(
        f"import pytest\n\n@pytest.mark.{marker}\ndef test_x():\n    pass\n"
    )
    done = run(tmp_path, "--devices", "sim:0-3", timeout=60)
    assert done.returncode == 4, done.stdout + done.stderr
    assert said in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr


def test_ranks_and_a_device_count_that_disagree_get_one_sentence(tmp_path: Path) -> None:
    (tmp_path / "test_bad.py").write_text(
        "import pytest\n\n@pytest.mark.ranks(2)\n@pytest.mark.device_count(3)\n"
        "def test_x():\n    pass\n\n"
        "@pytest.mark.ranks(2, devices_per_rank=2)\n@pytest.mark.device_count(4)\n"
        "def test_agrees():\n    pass\n"
    )
    done = run(tmp_path, "--devices", "sim:0-3", timeout=60)
    assert done.returncode == 4, done.stdout + done.stderr
    text = done.stdout + done.stderr
    assert "test_x: @pytest.mark.ranks(2, devices_per_rank=1) holds 2 devices" in text
    assert "device_count(3)" in text and "test_agrees" not in text


def test_more_ranks_than_devices_is_unsatisfiable(tmp_path: Path) -> None:
    (tmp_path / "test_big.py").write_text(
        "import pytest\n\n@pytest.mark.ranks(4)\ndef test_four():\n    pass\n"
    )
    done = run(tmp_path, "--devices", "sim:0-1", timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "needs 4 sim devices; the pool has 2" in done.stdout


def test_a_killed_controller_leaves_no_rank_behind(tmp_path: Path) -> None:
    (tmp_path / "test_slow.py").write_text(
        MEET
        + """
@pytest.mark.ranks(2, devices_per_rank=0)
def test_slow():
    seen("slow")
    time.sleep(600)
"""
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVPOOL_", "PYTEST_"))}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    controller = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "devpool.plugin", "-p", "no:cacheprovider"]
        + ["--devices", "auto", f"--devpool-lock-dir={tmp_path / 'locks'}"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        bound = time.monotonic() + 60
        while not all((tmp_path / f"seen-slow-{r}.json").exists() for r in (0, 1)):
            assert time.monotonic() < bound, "the ranks never started"
            time.sleep(0.05)
        pids = [int(seen(tmp_path, "slow", r)["pid"]) for r in (0, 1)]
        controller.send_signal(signal.SIGINT)
        controller.wait(timeout=60)
        bound = time.monotonic() + 10
        while time.monotonic() < bound and any(_alive(pid) for pid in pids):
            time.sleep(0.05)
        assert not [pid for pid in pids if _alive(pid)]
    finally:
        if controller.poll() is None:
            os.killpg(controller.pid, signal.SIGKILL)
            controller.wait()


FAULT_KINDS = ("pass", "fail", "die", "skip_one", "skip_all", "error_in_setup")


def _fault_test(index: int, kind: str, culprit: int, world: int) -> str:
    """One ranks(world) test whose rank `culprit` does `kind`; the others meet it."""
    body = {
        "pass": "meet()",
        "fail": f"if RANK == {culprit}:\n        assert False, 'rank {culprit} fails'\n    meet()",
        "die": f"if RANK == {culprit}:\n        os._exit(5)\n    meet()",
        "skip_one": f"if RANK == {culprit}:\n        pytest.skip('only {culprit}')\n    meet()",
        "skip_all": "pytest.skip('everywhere')",
        "error_in_setup": "meet()",
    }[kind]
    fixture = f", broken_on_{culprit}" if kind == "error_in_setup" else ""
    return (
        f"\n\n@pytest.mark.ranks({world}, devices_per_rank=0)\n"
        f"def test_{index}_{kind}(request{fixture}):\n"
        f"    RANK = int(os.environ['RANK'])\n    {body}\n"
    )


EXPECTED = {
    "pass": "passed",
    "fail": "failed",
    "die": "crashed",
    "skip_one": "failed",
    "skip_all": "skipped",
    "error_in_setup": "error",
}


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    world=st.integers(2, 3),
    faults=st.lists(
        st.tuples(st.sampled_from(FAULT_KINDS), st.integers(0, 2)), min_size=3, max_size=6
    ),
)
def test_random_rank_faults_give_one_true_outcome_each_and_leave_nothing(
    tmp_path_factory: pytest.TempPathFactory, world: int, faults: list[tuple[str, int]]
) -> None:
    root = tmp_path_factory.mktemp("faults")
    fixtures = "".join(
        f"\n\n@pytest.fixture\ndef broken_on_{r}():\n"
        f"    if os.environ['RANK'] == '{r}':\n        raise RuntimeError('setup {r}')\n"
        for r in range(3)
    )
    tests = "".join(
        _fault_test(i, kind, culprit % world, world) for i, (kind, culprit) in enumerate(faults)
    )
    (root / "test_random.py").write_text(MEET + fixtures + tests)
    done = run(root, "--devices", "auto", "-p", "no:randomly", "--devpool-reruns=0", timeout=240)
    output = done.stdout + done.stderr
    ends = job_ends(root)
    got = {name: end["outcome"] for name, end in ends.items()}
    want = {f"test_{i}_{kind}": EXPECTED[kind] for i, (kind, _) in enumerate(faults)}
    assert got == want, output
    lines = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    for i, (kind, _) in enumerate(faults):
        if kind == "error_in_setup":
            assert any(line.startswith(f"ERROR test_random.py::test_{i}_") for line in lines)
    assert done.returncode == (0 if set(want.values()) <= {"passed", "skipped"} else 1), output
    cases = [c.get("name") for c in ET.parse(root / "junit.xml").getroot().iter("testcase")]
    assert sorted(cases) == sorted(want)  # one testcase per test, not per rank
    assert_nothing_left(root)


def test_ranks_left_in_a_test_the_others_finished_are_ended_with_their_stacks(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_straggle.py").write_text(
        MEET
        + """
@pytest.mark.ranks(2, devices_per_rank=0)
def test_rank_1_skips_the_barrier():
    if os.environ["RANK"] == "0":
        meet()  # waits for a rank 1 that finished the test without coming


@pytest.mark.ranks(2, devices_per_rank=0)
def test_after():
    meet()
"""
    )
    done = run(tmp_path, "--devices", "auto", "-p", "no:randomly", "--devpool-rank-straggle=2")
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    ends = job_ends(tmp_path)
    assert {name: end["outcome"] for name, end in ends.items()} == {
        "test_rank_1_skips_the_barrier": "failed",
        "test_after": "passed",
    }, output
    assert "[rank 0] ended: rank 0 still in the test 2 s after rank 1 finished it" in output
    assert "in accept" in output  # rank 0's stacks show where it waited
    assert [r["outcome"] for r in ends["test_rank_1_skips_the_barrier"]["ranks"]] == [
        "ended",
        "passed",
    ]
    assert_nothing_left(tmp_path)
