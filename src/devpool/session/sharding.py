"""--devpool-shard K/N in the controller: the shard's tests kept, the split stamped into the
run record. The capacity package does the arithmetic; it is imported only by a run that
shards (the fixed cost of a run, issue 45).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import pytest

from devpool.errors import DevpoolError
from devpool.history.location import pending_location
from devpool.plan.once import PLUGIN as ONCE_PLUGIN
from devpool.plan.once import OnceFixture, marked_on


def parse_shard(text: str) -> tuple[int, int]:
    """K/N of --devpool-shard."""
    from devpool.capacity import shards

    return shards.parse_shard(text)


def keep_shard(controller: Any, config: pytest.Config, items: list[pytest.Item]) -> None:
    """--devpool-shard K/N: keep the tests of shard K, split by estimated device-seconds.
    controller: the run's session.controller.Controller (its shard, requests, estimates)."""
    from devpool.capacity import shards

    assert controller.shard is not None
    k, n = controller.shard
    settings = controller.settings
    default = settings.default_estimate
    platform = controller.inventory.platform
    capacity = shards.shard_capacity(platform, settings.memory_reserve)
    once = _once_fixtures(config, items, settings.platforms, settings.resources)
    setups = shards.once_setups(once, platform.name, platform.kind, controller.estimates, default)
    pieces = [
        shards.shard_item(
            item.nodeid,
            controller.requests[item.nodeid],
            controller.estimates.get(item.nodeid, default),
            by_module=settings.shard_by_module,
            capacity=capacity,
            once=[f.name for f in once if f.name in getattr(item, "fixturenames", ())],
        )
        for item in items
    ]
    split = shards.split_suite([item.nodeid for item in items], pieces, n, setups)
    chosen = split.members(k)
    # The record gets the whole split right after session_start, for `devpool shard verify`.
    controller.listeners.append(
        shards.SplitStamp(
            k,
            split,
            controller.emit,
            lambda: controller.items,
            history=str(controller.history_path),
            pending=pending_location(controller.history_path, controller.run_id),
        )
    )
    others = [item for item in items if item.nodeid not in chosen]
    if others:
        config.hook.pytest_deselected(items=others)
        items[:] = [item for item in items if item.nodeid in chosen]


def _once_fixtures(
    config: pytest.Config,
    items: list[pytest.Item],
    platforms: Collection[str],
    resources: Mapping[str, int],
) -> tuple[OnceFixture, ...]:
    """The once-fixtures as `devpool shard` finds them (capacity/collect.py): the table's,
    and those @devpool.once marked that the tests use (OnceCheck checks them all later)."""
    check: Any = config.pluginmanager.get_plugin(ONCE_PLUGIN)
    found: tuple[OnceFixture, ...] = tuple(check.table) if check is not None else ()
    for item in items:
        known = {fixture.name for fixture in found}
        try:
            found += marked_on(item, known, config.rootpath, platforms, resources)
        except DevpoolError as exc:
            raise pytest.UsageError(str(exc)) from None
    return found
