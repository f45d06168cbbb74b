"""CPU-only tests: no marker, so they run in CPU slots beside the device tests."""

import os

import pytest


@pytest.mark.parametrize("n", range(8))
def test_shape_math(n: int) -> None:
    assert sum(range(n + 1)) == n * (n + 1) // 2


def test_cpu_tests_see_no_device() -> None:
    # devpool hides every device from CPU-only tests: stray device use fails loudly.
    assert os.environ["DEVPOOL_DEVICES"] == ""
    assert os.environ["DEVPOOL_SIM_VISIBLE_DEVICES"] == ""
