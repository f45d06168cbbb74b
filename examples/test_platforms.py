"""Platform-specific tests: deselected, with the reason shown, where the platform differs."""

import pytest


@pytest.mark.platforms(["cuda"])
@pytest.mark.device_count(1)
def test_cuda_graphs_capture() -> None:
    raise AssertionError("only runs on cuda sessions")


@pytest.mark.platforms(["sim", "cuda"])
@pytest.mark.device_count(1)
def test_portable_kernel(devpool_platform: str) -> None:
    assert devpool_platform == "sim"
