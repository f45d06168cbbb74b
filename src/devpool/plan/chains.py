"""pytest-order and pytest-dependency: tests tied by their markers run as one ordered chain.

Both plugins decide in the controller's collection (pytest-order sorts the items,
pytest-dependency records each test's result in the session that ran it), so the tests
they tie must run in one process, one after another, in the collection's order. A chain is
one placement for the scheduler: its first test is queued, the rest go to the same worker
in the same batch, whatever the isolation mode. Its tests share one request, the largest
of them, so one lease serves them all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import pytest

from devpool.plan.jobs import Job

MARKERS = ("order", "dependency")


def _tied(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(name) is not None for name in MARKERS)


def _reaches_other_modules(item: pytest.Item) -> bool:
    """A dependency of session or package scope, or an order relative to a test named with
    its module: the chain then spans the whole session."""
    dependency = item.get_closest_marker("dependency")
    if dependency is not None and dependency.kwargs.get("scope", "module") not in (
        "module",
        "class",
    ):
        return True
    order = item.get_closest_marker("order")
    if order is not None:
        for key in ("before", "after"):
            names = order.kwargs.get(key) or ()
            names = [names] if isinstance(names, str) else list(names)
            if any(".py" in str(name) for name in names):
                return True
    return False


def tie(jobs: Sequence[Job], items: Mapping[str, pytest.Item]) -> int:
    """Tie the jobs of marked tests into chains (one per module, or one for the session
    when a marker reaches across modules); returns how many chains were made."""
    tied = [job for job in jobs if job.request.nodes == 1 and _tied(items[job.nodeid])]
    if not tied:
        return 0
    groups: dict[str, list[Job]] = {}
    whole = any(_reaches_other_modules(items[job.nodeid]) for job in tied)
    for job in tied:
        groups.setdefault("" if whole else job.location[0], []).append(job)
    made = 0
    for members in groups.values():
        if len(members) < 2:
            continue
        members.sort(key=lambda job: job.index)  # the plugin's order: the collection's
        _share_one_request(members)
        chain = tuple(members)
        for job in members:
            job.chain = chain
        made += 1
    return made


def _share_one_request(members: list[Job]) -> None:
    """The largest request of the chain for every test of it, on whole devices: the
    chain's first test is placed for all of them."""
    count = max(job.request.device_count for job in members)
    failed_before = any(job.failed_before for job in members)
    for job in members:
        job.request = replace(job.request, device_count=count, device_memory=None)
        job.failed_before = failed_before
