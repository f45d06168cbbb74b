"""Sharding memory tests (shards.py): a device_memory test costs its share of a device."""

from __future__ import annotations

import hashlib
import json

from devpool.capacity.shards import ShardItem, assign, shard_capacity, shard_item, split_suite
from devpool.devices.inventory import Platform
from devpool.plan.markers import Request

GiB = 2**30
SIM = Platform("sim", "sim", "", "sim", memory=80 * GiB)


def test_capacity_is_the_configured_memory_less_the_reserve() -> None:
    assert shard_capacity(SIM, 0.0) == 80 * GiB
    assert shard_capacity(SIM, 0.05) == int(80 * GiB * 0.95)
    # Unknown without configuration: a device query would differ between runners.
    assert shard_capacity(Platform("cuda", "cuda", "CUDA_VISIBLE_DEVICES", "GPU"), 0.05) is None


def test_a_memory_test_costs_its_share_of_each_device() -> None:
    capacity = 80 * GiB
    small = shard_item("t.py::small", Request(1, device_memory=5 * GiB), 10.0, capacity=capacity)
    assert small.share == 1 / 16
    assert small.cost == 10.0 / 16
    pair = shard_item("t.py::pair", Request(2, device_memory=40 * GiB), 10.0, capacity=capacity)
    assert pair.cost == 2 * 0.5 * 10.0
    whole = shard_item("t.py::whole", Request(2), 10.0, capacity=capacity)
    assert whole.cost == 20.0
    unknown = shard_item("t.py::small", Request(1, device_memory=5 * GiB), 10.0)
    assert unknown.cost == 10.0  # no capacity: it may hold a whole device, and is charged so
    too_big = shard_item("t.py::big", Request(1, device_memory=90 * GiB), 10.0, capacity=capacity)
    assert too_big.share == 1.0


def test_small_memory_tests_no_longer_crowd_out_whole_device_work() -> None:
    # Two runners of one 80 GiB device: three 100 s whole-device tests, and 160 small 5 GiB
    # tests of 10 s that sixteen at a time share a device (100 s of device time in all).
    def items(capacity: int | None) -> list[ShardItem]:
        whole = [shard_item(f"w.py::t{i}", Request(1), 100.0) for i in range(3)]
        small = [
            shard_item(
                f"s.py::t{i:03d}", Request(1, device_memory=5 * GiB), 10.0, capacity=capacity
            )
            for i in range(160)
        ]
        return whole + small

    real = {item.nodeid: item.cost for item in items(80 * GiB)}  # what each really occupies

    def slowest(split: list[list[ShardItem]]) -> float:
        return max(sum(real[item.nodeid] for item in shard) for shard in split)

    # Charged as whole devices (1,600 s), the small tests are spread as if they were the
    # bulk of the work: one runner gets two whole tests and half the small ones.
    assert slowest(assign(items(None), 2)) > 240
    # At their share, two whole tests on one runner, one whole and every small on the other.
    assert slowest(assign(items(80 * GiB), 2)) == 200


def test_fingerprints_of_whole_device_suites_are_unchanged() -> None:
    items = [shard_item(f"t.py::t{i}", Request(i % 3), 1.5 + i) for i in range(9)]
    split = split_suite([i.nodeid for i in items], items, 2)
    # The cost snapshot exactly as it was hashed before memory shares existed.
    before = sorted((i.nodeid, i.group, i.device_count, repr(i.estimate)) for i in items)
    text = json.dumps(before, separators=(",", ":"), ensure_ascii=False)
    assert split.costs == hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def test_a_share_is_part_of_the_cost_snapshot() -> None:
    def split(capacity: int | None) -> str:
        items = [
            shard_item("t.py::a", Request(1, device_memory=8 * GiB), 4.0, capacity=capacity),
            shard_item("t.py::b", Request(1), 4.0, capacity=capacity),
        ]
        return split_suite(["t.py::a", "t.py::b"], items, 2).costs

    assert split(80 * GiB) == split(80 * GiB)
    assert split(80 * GiB) != split(40 * GiB) != split(None)
