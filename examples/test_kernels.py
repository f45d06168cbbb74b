"""One-device tests: the bulk of a kernel suite."""

import os

import pytest

from conftest import simulate_work


@pytest.mark.device_count(1)
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16", "fp8"])
@pytest.mark.parametrize("size", [128, 1024, 4096])
def test_matmul(exclusive_devices: list[int], dtype: str, size: int) -> None:
    assert len(exclusive_devices) == 1
    assert os.environ["DEVPOOL_SIM_VISIBLE_DEVICES"] == str(exclusive_devices[0])
    assert simulate_work(0.05 + size / 40000) > 0
