"""Multi-device tests: all-reduce across 2 and 4 devices."""

import pytest

from conftest import simulate_work


@pytest.mark.device_count(2)
@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_allreduce_pair(exclusive_devices: list[int], op: str) -> None:
    assert len(set(exclusive_devices)) == 2
    assert simulate_work(0.3) > 0


@pytest.mark.device_count(4)
@pytest.mark.parametrize("algo", ["ring", "tree"])
def test_allreduce_four(exclusive_devices: list[int], algo: str) -> None:
    assert len(set(exclusive_devices)) == 4
    assert simulate_work(0.5) > 0


@pytest.mark.device_count(8)
def test_full_node_training_step(exclusive_devices: list[int]) -> None:
    assert exclusive_devices == list(range(8))
    assert simulate_work(0.8) > 0
