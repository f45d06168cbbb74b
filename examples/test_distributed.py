"""Distributed tests: one body on two ranks, as under torchrun, with one outcome per test.

Each rank is a process of its own with torchrun's environment (RANK, WORLD_SIZE,
MASTER_PORT, ...) and one of the test's devices; the group the first test makes serves the
next. With torch installed the ranks talk through a real gloo group; without it they skip.
"""

import os

import pytest

pytestmark = pytest.mark.ranks(2)  # two ranks, one sim device each


@pytest.fixture
def dist():
    """torch.distributed with the process's group, made by the first test that needs it
    (Megatron's way), imported here: collecting the examples does not import torch, and
    without torch each test skips, saying why (its request is counted all the same)."""
    pytest.importorskip("torch", reason="the distributed examples need torch (gloo)")
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return dist


def test_all_reduce(dist, devpool_rank) -> None:
    import torch

    tensor = torch.ones(4) * (devpool_rank.rank + 1)
    dist.all_reduce(tensor)
    assert tensor.tolist() == [3.0] * 4
    assert len(devpool_rank.devices) == 1  # its own device: index LOCAL_RANK of the visible ones


def test_broadcast_reuses_the_group(dist) -> None:
    import torch

    tensor = torch.arange(3.0) if os.environ["RANK"] == "0" else torch.zeros(3)
    dist.broadcast(tensor, src=0)
    assert tensor.tolist() == [0.0, 1.0, 2.0]
