"""Each collected test's request, read once the collection is final (markers a conftest
added in pytest_collection_modifyitems count), and the tests the platform filter deselects."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from devpool.config import Settings
from devpool.devices.inventory import Inventory
from devpool.errors import DevpoolError
from devpool.plan import skips
from devpool.plan.jobs import cpus_reason
from devpool.plan.markers import Request, request_for


@dataclass
class Collected:
    """What the collected items ask for, and which of them this session keeps."""

    requests: dict[str, Request] = field(default_factory=dict)  # kept tests only
    asked: dict[str, int] = field(default_factory=dict)  # devices each test asks for
    classes: dict[str, tuple[str, ...]] = field(default_factory=dict)  # platforms filters
    deselected: list[tuple[str, str]] = field(default_factory=list)  # (node id, why)
    keep: list[pytest.Item] = field(default_factory=list)
    dropped: list[pytest.Item] = field(default_factory=list)


def read_requests(items: list[pytest.Item], settings: Settings, inventory: Inventory) -> Collected:
    """Every item's request; an item whose platforms() leave out this session's is dropped.
    A marker a user got wrong, or cpus() beyond the slots, is a pytest.UsageError."""
    platform = inventory.platform
    found = Collected()
    for item in items:
        try:
            request = request_for(
                item,
                settings.platforms,
                settings.device_memory,
                settings.resources,
            )
        except DevpoolError as exc:
            raise pytest.UsageError(str(exc)) from None
        over = request.cpus_total > settings.cpu_slots
        if over and not settings.skip_unsatisfiable:
            raise pytest.UsageError(
                f"{item.nodeid}: {cpus_reason(request, settings.cpu_slots)}; lower "
                "it, or pass --devpool-skip-unsatisfiable to skip such tests"
            )
        found.asked[item.nodeid] = request.device_count * request.nodes  # for a queue
        if request.platforms is not None:  # its class, in a queue run (queue/classes.py)
            found.classes[item.nodeid] = request.platforms
        request = skips.beyond_pool(item, request, len(inventory.devices))
        if request.platforms is not None and not (
            platform.name in request.platforms or platform.kind in request.platforms
        ):
            listed = ", ".join(request.platforms)
            found.deselected.append(
                (item.nodeid, f"platform {platform.name} not in platforms([{listed}])")
            )
            found.dropped.append(item)
            continue
        found.requests[item.nodeid] = request
        found.keep.append(item)
    return found
