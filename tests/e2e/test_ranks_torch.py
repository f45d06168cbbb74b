"""End to end with a real torch.distributed gloo group: `ranks(n)` (issue 36).

A Megatron-style file (every body runs on every rank; the process group comes from
torchrun's environment and is made once) passes under devpool with a `ranks(2)` marker,
and its outcomes are the ones `torchrun --nproc_per_node=2 -m pytest` gives, run side by
side here as the oracle. CI installs a CPU torch (.ci/run); elsewhere these skip without it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from test_ranks import assert_nothing_left, job_ends, run

if os.environ.get("CI") == "true":
    import torch  # noqa: F401 - CI installs it: a missing torch fails here, loudly
else:
    pytest.importorskip("torch")

MEGATRON_STYLE = """
import os

import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.ranks(2, devices_per_rank=0)  # the one line devpool needs


@pytest.fixture(scope="session", autouse=True)
def process_group():
    # As Megatron's Utils.initialize_distributed: one group for the whole session.
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    yield


def test_all_reduce():
    tensor = torch.ones(4) * (dist.get_rank() + 1)
    dist.all_reduce(tensor)
    assert tensor.tolist() == [3.0] * 4


def test_broadcast_from_rank_0():
    tensor = torch.arange(3.0) if dist.get_rank() == 0 else torch.zeros(3)
    dist.broadcast(tensor, src=0)
    assert tensor.tolist() == [0.0, 1.0, 2.0]


def test_all_gather():
    parts = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, torch.tensor([float(dist.get_rank())]))
    assert [p.item() for p in parts] == [0.0, 1.0]


def test_world_comes_from_torchruns_environment():
    assert dist.get_world_size() == int(os.environ["WORLD_SIZE"]) == 2
    assert dist.get_rank() == int(os.environ["RANK"])


@pytest.mark.skip(reason="skipped everywhere, as on every rank under torchrun")
def test_skipped():
    pass
"""

# Runs pytest in each torchrun rank with a JUnit file of its own.
TORCHRUN_RANK = """
import os
import sys

import pytest

rank = os.environ["RANK"]
sys.exit(pytest.main(["-p", "no:cacheprovider", f"--junitxml=torchrun-{rank}.xml", *sys.argv[1:]]))
"""


def outcomes(xml: Path) -> dict[str, str]:
    """Each testcase's outcome in a JUnit file: passed, failed, error or skipped."""
    found = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        found[str(case.get("name"))] = {"failure": "failed"}.get(
            kinds[0] if kinds else "passed", kinds[0] if kinds else "passed"
        )
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_megatron_style_file_gives_torchrun_around_pytests_outcomes(tmp_path: Path) -> None:
    (tmp_path / "test_megatron_style.py").write_text(MEGATRON_STYLE)
    (tmp_path / "torchrun_rank.py").write_text(TORCHRUN_RANK)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVPOOL_", "PYTEST_"))}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env["TMPDIR"] = str(tmp_path)  # torchrun's torchelastic_* folders stay in the test's own
    oracle = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"]
        + [f"--master_port={free_port()}", "torchrun_rank.py", "test_megatron_style.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert oracle.returncode == 0, oracle.stdout + oracle.stderr
    expected = outcomes(tmp_path / "torchrun-0.xml")
    assert expected == outcomes(tmp_path / "torchrun-1.xml")
    assert set(expected.values()) == {"passed", "skipped"}

    done = run(tmp_path, "--devices", "auto", "test_megatron_style.py")
    assert done.returncode == 0, done.stdout + done.stderr
    assert outcomes(tmp_path / "junit.xml") == expected
    # One group for the file: the same two processes ran every test.
    ends = job_ends(tmp_path)
    groups = {tuple(r["pid"] for r in end["ranks"]) for end in ends.values() if "ranks" in end}
    assert len(groups) == 1, ends
    assert_nothing_left(tmp_path)


GROUPS = """
import os

import pytest
import torch
import torch.distributed as dist


def group():
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return dist.group.WORLD


@pytest.mark.ranks(4, devices_per_rank=0)
def test_all_reduce_on_four_ranks():
    group()
    tensor = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(tensor)
    assert tensor.item() == 6.0


@pytest.mark.ranks(2, devices_per_rank=0)
def test_a_makes_the_group():
    assert not dist.is_initialized()
    group()
    dist.barrier()


@pytest.mark.ranks(2, devices_per_rank=0)
def test_b_reuses_it():
    assert dist.is_initialized(), "the group test_a made is gone"
    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    assert tensor.item() == 2.0


@pytest.mark.ranks(2, devices_per_rank=0)
def test_c_fails_on_rank_1_while_rank_0_waits_in_a_barrier():
    group()
    if dist.get_rank() == 1:
        raise RuntimeError("rank one gave up")
    dist.barrier()


@pytest.mark.ranks(2, devices_per_rank=0)
def test_d_gets_a_fresh_group():
    assert not dist.is_initialized(), "a failed test's group came back"
    group()
    dist.barrier()


@pytest.mark.ranks(2, devices_per_rank=0)
def test_e_dies_on_rank_1_while_rank_0_waits_in_an_all_reduce():
    group()
    if dist.get_rank() == 1:
        os._exit(9)
    dist.all_reduce(torch.ones(1))


@pytest.mark.ranks(2, devices_per_rank=0)
@pytest.mark.timeout(5)
def test_f_stalls_on_rank_0_while_rank_1_waits_in_a_barrier():
    group()
    if dist.get_rank() == 0:
        import time

        time.sleep(300)
    dist.barrier()


@pytest.mark.ranks(2, devices_per_rank=0)
def test_g_skips_on_rank_0_only():
    group()
    if dist.get_rank() == 0:
        pytest.skip("rank 0 has no second card")
    dist.barrier()


@pytest.mark.ranks(2, devices_per_rank=0)
def test_h_runs_after_all_that():
    group()
    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    assert tensor.item() == 2.0
"""


def test_gloo_groups_are_reused_after_a_pass_and_fresh_after_a_failure(tmp_path: Path) -> None:
    (tmp_path / "test_groups.py").write_text(GROUPS)
    done = run(tmp_path, "--devices", "auto", "-p", "no:randomly", "--devpool-reruns=0")
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    ends = job_ends(tmp_path)
    assert {name: end["outcome"] for name, end in ends.items()} == {
        "test_all_reduce_on_four_ranks": "passed",
        "test_a_makes_the_group": "passed",
        "test_b_reuses_it": "passed",
        "test_c_fails_on_rank_1_while_rank_0_waits_in_a_barrier": "failed",
        "test_d_gets_a_fresh_group": "passed",
        "test_e_dies_on_rank_1_while_rank_0_waits_in_an_all_reduce": "crashed",
        "test_f_stalls_on_rank_0_while_rank_1_waits_in_a_barrier": "timeout",
        "test_g_skips_on_rank_0_only": "failed",
        "test_h_runs_after_all_that": "passed",
    }, output
    assert "rank 1: RuntimeError: rank one gave up" in output
    assert "[rank 0] ended: rank 1 failed" in output
    assert (
        "rank 1 (pid" in ends["test_e_dies_on_rank_1_while_rank_0_waits_in_an_all_reduce"]["detail"]
    )
    assert "time.sleep(300)" in output  # rank 0's stalled line, in its labelled stacks
    assert "skipped on rank 0 only, ran on rank 1" in output
    assert_nothing_left(tmp_path)
