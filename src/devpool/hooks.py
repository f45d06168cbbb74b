"""devpool's own pytest hooks, for plugins and conftest files (registered by plugin.py)."""

from __future__ import annotations

import pytest


@pytest.hookspec(firstresult=True)
def pytest_devpool_device_initialised(config: pytest.Config) -> str | None:
    """The device runtime this process has initialised (e.g. "acl"), or None.

    A process holding a device runtime must not be forked. devpool asks this of a fork
    server's template after every collection report; torch.cuda, torch.npu, torch.xpu,
    torch.mlu and jax it knows itself. Implement it for a runtime of your own."""
