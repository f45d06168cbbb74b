"""Tests the pool cannot hold that pytest skips anyway: they keep plain pytest's outcome.

A skip condition that counts devices (`skipif(device_count() < 2)`, unittest's
`skipUnless`) is evaluated where the test is collected. The controller sees the devices
plain pytest would see; when it finds such a test skipped and the pool is too small for the
test's request, the test runs as a CPU test, and its worker, which sees no device, reports
pytest's own skip (reason and place), instead of failing as unsatisfiable.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from devpool.plan.markers import Request


def skipped_here(item: pytest.Item) -> bool:
    """Whether pytest skips the test by its marks as this process evaluates them: skip,
    skipif, or unittest's skip decorators on the test or its class."""
    from _pytest.skipping import evaluate_skip_marks

    try:
        if evaluate_skip_marks(item) is not None:
            return True
    except (Exception, pytest.fail.Exception):  # the worker reports it, as pytest would
        return False
    own = getattr(item, "obj", None)
    cls = getattr(item, "cls", None)
    return any(getattr(obj, "__unittest_skip__", False) is True for obj in (own, cls))


def beyond_pool(item: pytest.Item, request: Request, devices: int) -> Request:
    """The request to plan: a CPU one for a test that needs more devices than the pool has
    and that pytest skips here anyway; else the request itself."""
    if request.device_count <= devices or request.nodes > 1 or not skipped_here(item):
        return request
    return replace(
        request,
        device_count=0,
        ranks=0,
        devices_per_rank=1,
        device_memory=None,
        device_exclusive=False,
    )
