"""Two-rank gloo tests: spawn-per-test, torchrun around pytest, and devpool's ranks(2).

Run: python benchmarks/ranks.py [--repeat 1] [--tests 30]

The same tests (an all-reduce and a broadcast on a 2-rank torch.distributed gloo group,
torch on CPU) three ways, side by side in one run:
- spawn-per-test under plain pytest (PyTorch's MultiProcessTestCase, DeepSpeed's
  DistributedTest): each test starts two fresh interpreters that import torch and make a
  group;
- `torchrun --nproc_per_node=2 -m pytest` (Megatron-LM): two pytest sessions in lockstep,
  one group for the session;
- devpool, `@pytest.mark.ranks(2, devices_per_rank=0)` (`--devices auto`): the ranks fork
  from the warm template, and the group one test made serves the next.
Targets (issue 36): ranks(2) ≤ 0.1× spawn-per-test and ≤ 1.3× torchrun around pytest.
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
from pathlib import Path

from common import PYTEST, Variant, alternate, devpool_options, show_ratio, suite_root

SPAWN_TARGET = 0.1
TORCHRUN_TARGET = 1.3

BODY = """
def check(rank):
    tensor = torch.ones(8) * (rank + 1)
    dist.all_reduce(tensor)
    assert tensor.tolist() == [3.0] * 8
    source = torch.arange(4.0) if rank == 0 else torch.zeros(4)
    dist.broadcast(source, src=0)
    assert source.tolist() == [0.0, 1.0, 2.0, 3.0]
"""

SPAWN = (
    """
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
"""
    + BODY
    + """

def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_main(rank, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    check(rank)
    dist.destroy_process_group()


@pytest.mark.parametrize("i", range({tests}))
def test_gloo(i):
    mp.spawn(rank_main, args=(free_port(),), nprocs=2, join=True)
"""
)

SESSION = (
    """
import pytest
import torch
import torch.distributed as dist
{marker}
"""
    + BODY
    + """

@pytest.fixture(scope="session", autouse=True)
def group():
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    yield


@pytest.mark.parametrize("i", range({tests}))
def test_gloo(i):
    check(dist.get_rank())
"""
)

TORCHRUN_RANK = """
import sys

import pytest

sys.exit(pytest.main(sys.argv[1:]))
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--tests", type=int, default=30)
    args = parser.parse_args()
    marker = "pytestmark = pytest.mark.ranks(2, devices_per_rank=0)"
    files = {
        "test_spawn.py": SPAWN.replace("{tests}", str(args.tests)),
        "test_session.py": SESSION.format(marker="", tests=args.tests),
        "test_ranks.py": SESSION.format(marker=marker, tests=args.tests),
        "torchrun_rank.py": TORCHRUN_RANK,
    }
    with tempfile.TemporaryDirectory(prefix="devpool-ranks-") as tmp:
        root = suite_root(Path(tmp), files)
        options = devpool_options(root, "auto", root / "h.sqlite")
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"]
        variants = [
            Variant("spawn per test", [*PYTEST, "-p", "no:devpool", "test_spawn.py"]),
            Variant(
                "torchrun -m pytest",
                [*torchrun, f"--master_port={free_port()}", "torchrun_rank.py"]
                + [*PYTEST[3:], "-p", "no:devpool", "test_session.py"],
            ),
            Variant("devpool ranks(2)", [*PYTEST, *options, "test_ranks.py"]),
        ]
        print(f"{args.tests} two-rank gloo tests (torch on CPU), {args.repeat} run(s) each")
        alternate(variants, root, args.repeat)
    spawn, around, ranks = variants
    print(show_ratio(ranks, spawn, SPAWN_TARGET))
    print(show_ratio(ranks, around, TORCHRUN_TARGET))
    print(f"  spawn per test: {spawn.median / args.tests:.2f} s a test")
    print(f"  devpool ranks(2): {ranks.median / args.tests:.3f} s a test")


if __name__ == "__main__":
    main()
