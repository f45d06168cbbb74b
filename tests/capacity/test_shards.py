"""Unit tests of CI sharding (shards.py): LPT balance, atomic groups, determinism, budgets."""

from __future__ import annotations

import random

import pytest

from devpool.capacity.shards import (
    ShardItem,
    assign,
    parse_budget,
    parse_shard,
    select,
    shard_item,
    shards_for_budget,
    split_suite,
    wall_estimate,
)
from devpool.errors import DevpoolError
from devpool.plan.markers import Request


def suite(seed: int = 7, count: int = 120) -> list[ShardItem]:
    """A suite with known durations: 1/2/4/8-device and CPU tests, skewed durations."""
    rng = random.Random(seed)
    return [
        ShardItem(
            f"tests/test_m{i % 9}.py::test_{i}",
            "",
            rng.choice([0, 1, 1, 1, 2, 2, 4, 8]),
            round(rng.lognormvariate(1.5, 0.8), 3),
        )
        for i in range(count)
    ]


def loads(split: list[list[ShardItem]]) -> list[float]:
    return [sum(item.cost for item in shard) for shard in split]


def test_cost_is_device_seconds_and_cpu_tests_cost_their_seconds() -> None:
    assert ShardItem("a", "", 4, 2.5).cost == 10.0
    assert ShardItem("a", "", 0, 2.5).cost == 2.5


def test_wall_estimate_is_spread_work_or_the_longest_test() -> None:
    items = [ShardItem("a", "", 8, 10.0), ShardItem("b", "", 1, 8.0)]
    assert wall_estimate(items, 8) == pytest.approx(11.0)  # (80 + 8) / 8
    assert wall_estimate([ShardItem("c", "", 1, 30.0)], 8) == 30.0
    assert wall_estimate([], 8) == 0.0


@pytest.mark.parametrize("shards", [2, 3, 4, 6])
def test_lpt_balances_known_durations_within_ten_percent(shards: int) -> None:
    items = suite()
    split = assign(items, shards)
    costs = loads(split)
    # No test here is near a shard's share, so LPT alone must get within 10%.
    assert max(item.cost for item in items) < 0.5 * min(costs)
    assert max(costs) - min(costs) <= 0.10 * max(costs)


def test_balance_is_limited_by_the_longest_test() -> None:
    items = [ShardItem("big", "", 8, 100.0)] + [ShardItem(f"s{i}", "", 1, 1.0) for i in range(10)]
    costs = loads(assign(items, 2))
    assert sorted(costs) == [10.0, 800.0]  # nothing can balance an 800 device-second test


def test_every_test_lands_in_exactly_one_shard() -> None:
    items = suite()
    split = assign(items, 5)
    ids = [item.nodeid for shard in split for item in shard]
    assert sorted(ids) == sorted(item.nodeid for item in items)


def test_groups_stay_together() -> None:
    items = [
        ShardItem(f"tests/test_m{i % 6}.py::test_{i}", f"tests/test_m{i % 6}.py", 1, 1.0 + i % 5)
        for i in range(60)
    ]
    split = assign(items, 4)
    for group in {item.group for item in items}:
        holders = [k for k, shard in enumerate(split) if any(i.group == group for i in shard)]
        assert len(holders) == 1, f"{group} split across shards {holders}"


def test_same_input_and_shuffled_input_give_the_same_shards() -> None:
    items = suite(seed=3)
    first = assign(items, 4)
    assert assign(items, 4) == first
    shuffled = list(items)
    random.Random(11).shuffle(shuffled)
    assert assign(shuffled, 4) == first


def test_ties_are_broken_by_group_name() -> None:
    items = [ShardItem(name, "", 1, 1.0) for name in ("d", "b", "c", "a")]
    assert [[i.nodeid for i in shard] for shard in assign(items, 2)] == [["a", "c"], ["b", "d"]]


def test_zero_cost_tests_spread_over_shards() -> None:
    items = [ShardItem(f"t{i}", "", 0, 0.0) for i in range(9)]
    assert [len(shard) for shard in assign(items, 3)] == [3, 3, 3]


def test_more_shards_than_tests_leaves_some_empty() -> None:
    split = assign([ShardItem("a", "", 1, 1.0)], 3)
    assert [len(s) for s in split] == [1, 0, 0]


def test_shard_count_must_be_positive() -> None:
    with pytest.raises(DevpoolError, match="into 0 shards"):
        assign([], 0)


def test_shard_item_groups_by_module_and_counts_every_node() -> None:
    item = shard_item("tests/test_x.py::TestA::test_b[1]", Request(4, nodes=2), 3.0, by_module=True)
    assert item == ShardItem("tests/test_x.py::TestA::test_b[1]", "tests/test_x.py", 8, 3.0)
    alone = shard_item("tests/test_x.py::test_c", Request(0), 1.0)
    assert alone.group == "tests/test_x.py::test_c"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("45m", 2700.0),
        ("1h30m", 5400.0),
        ("90s", 90.0),
        ("2700", 2700.0),
        ("1h", 3600.0),
        ("1.5h", 5400.0),
        ("2m30s", 150.0),
        (" 10M ", 600.0),
    ],
)
def test_parse_budget(text: str, seconds: float) -> None:
    assert parse_budget(text) == seconds


@pytest.mark.parametrize("text", ["45 parsecs", "", "m", "1x", "-5m", "30m1h"])
def test_parse_budget_rejects_non_durations(text: str) -> None:
    with pytest.raises(DevpoolError) as info:
        parse_budget(text)
    assert str(info.value) == f"budget {text!r} is not a duration like 45m, 1h30m or 90s"


def test_parse_budget_rejects_zero() -> None:
    with pytest.raises(DevpoolError, match="leaves no time"):
        parse_budget("0m")


def test_parse_shard() -> None:
    assert parse_shard("2/4") == (2, 4)
    assert parse_shard("1/1") == (1, 1)
    with pytest.raises(DevpoolError) as info:
        parse_shard("5/4")
    assert str(info.value) == "--devpool-shard '5/4' is out of range: K must be 1..4"
    with pytest.raises(DevpoolError, match="out of range"):
        parse_shard("0/4")
    with pytest.raises(DevpoolError, match="is not K/N"):
        parse_shard("2 of 4")
    with pytest.raises(DevpoolError, match="N must be 1 or more"):
        parse_shard("0/0")


def test_shards_for_budget_is_the_fewest_that_fit() -> None:
    items = [ShardItem(f"t{i}", "", 1, 100.0) for i in range(10)]
    # On one device: 10 × 100 s; LPT with 4 shards gives 300 s > 250 s, with 5 gives 200 s.
    assert shards_for_budget(items, 250.0, 1) == 5
    assert max(wall_estimate(s, 1) for s in assign(items, 4)) > 250.0
    # On 8 devices all ten fit one runner: 1000 / 8 = 125 s.
    assert shards_for_budget(items, 250.0, 8) == 1
    assert shards_for_budget([], 60.0, 8) == 1


def test_a_single_test_over_budget_is_an_error() -> None:
    items = [ShardItem("tests/x.py::t", "", 1, 3100.0), ShardItem("tests/y.py::u", "", 1, 5.0)]
    with pytest.raises(DevpoolError) as info:
        shards_for_budget(items, 2700.0, 8)
    assert str(info.value) == (
        "tests/x.py::t needs 3,100 s alone on 8 devices; the budget is 2,700 s"
    )


def test_select_partitions_the_collected_suite() -> None:
    items = suite(count=40)
    order = [item.nodeid for item in items]
    parts = [select(order, items, k, 3) for k in (1, 2, 3)]
    assert set().union(*parts) == set(order)
    assert sum(len(p) for p in parts) == len(order)
    assert parts[0] == {i.nodeid for i in assign(items, 3)[0]}


def test_select_counts_tests_without_items_and_drops_uncollected_ones() -> None:
    items = [ShardItem("a", "", 1, 1.0), ShardItem("gone", "", 8, 1000.0)]
    order = ["a", "b", "c", "d"]
    parts = [select(order, items, k, 2) for k in (1, 2)]
    assert parts[0] | parts[1] == set(order)
    assert not parts[0] & parts[1]
    assert sorted(len(p) for p in parts) == [2, 2]  # "gone" weighs nothing: it was not collected
    with pytest.raises(DevpoolError, match="out of range"):
        select(order, items, 3, 2)


def test_split_fingerprint_is_a_function_of_tests_requests_and_costs() -> None:
    items = suite(count=40)
    order = [item.nodeid for item in items]
    first = split_suite(order, items, 3)
    shuffled = list(reversed(items))
    again = split_suite(list(reversed(order)), shuffled, 3)
    assert again == first  # same tests, same costs: same split, same fingerprint
    assert sorted(n for shard in first.shards for n in shard) == sorted(order)
    assert [first.members(k) for k in (1, 2, 3)] == [select(order, items, k, 3) for k in (1, 2, 3)]
    cheaper = [ShardItem(i.nodeid, i.group, i.device_count, i.estimate / 2) for i in items]
    other = split_suite(order, cheaper, 3)
    # Same shares, so the same assignment, but another cost snapshot: another fingerprint.
    assert other.shards == first.shards
    assert (other.costs, other.fingerprint) != (first.costs, first.fingerprint)
    bigger = [*items[:-1], ShardItem(items[-1].nodeid, "", 8, 500.0)]
    assert split_suite(order, bigger, 3).fingerprint != first.fingerprint
    assert split_suite(order, items, 4).fingerprint != first.fingerprint
