"""Sharding counts once-fixtures (shards.py): a shard with a user of one pays its setup once,
users of a costly one gather, and the split stays deterministic and fingerprinted."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_capacity import collected

from devpool.capacity.costs import report
from devpool.capacity.shards import (
    OnceSetup,
    ShardItem,
    assign,
    once_setups,
    paid,
    shard_cost,
    shard_item,
    shards_for_budget,
    split_suite,
    wall_estimate,
)
from devpool.errors import DevpoolError
from devpool.plan.markers import Request
from devpool.plan.once import history_id, parse_once, setup_history_id

SERVER = {"server": OnceSetup("server", 2, 50.0)}  # 100 device-s a setup


def user(name: str, seconds: float = 1.0, once: tuple[str, ...] = ("server",)) -> ShardItem:
    return ShardItem(name, "", 1, seconds, once=once)


def others(count: int = 40, seconds: float = 10.0) -> list[ShardItem]:
    return [ShardItem(f"other{i:02d}", "", 1, seconds) for i in range(count)]


def test_a_shard_pays_each_setup_once_whatever_its_users() -> None:
    shard = [user("a"), user("b"), ShardItem("c", "", 4, 2.0)]
    assert [s.name for s in paid(shard, SERVER)] == ["server"]
    assert shard_cost(shard, SERVER) == 1.0 + 1.0 + 8.0 + 100.0
    assert shard_cost(shard) == 10.0  # no setups known: the tests alone
    # Spread over 4 devices, but a user waits for the setup: 50 s + its own second.
    assert wall_estimate(shard, 4, SERVER) == pytest.approx(max(110.0 / 4, 51.0))
    assert wall_estimate(shard, 1, SERVER) == pytest.approx(110.0)
    assert paid([ShardItem("c", "", 4, 2.0)], SERVER) == []
    # A fixture sharding does not charge (it runs once on another platform) costs nothing.
    assert shard_cost([user("a", once=("elsewhere",))], SERVER) == 1.0


def test_setups_come_from_the_history_else_the_default_where_they_run_once() -> None:
    table = {
        "server": {"device_count": 2},
        "dataset": {},
        "on_cuda": {"device_count": 1, "platforms": ["cuda"]},
    }
    fixtures = parse_once({"once": table}, "t", ["sim", "cuda"])
    estimates = {setup_history_id("server"): 30.0, history_id("server"): 500.0}
    setups = once_setups(fixtures, "sim", "sim", estimates, 1.5)
    assert setups == {
        "server": OnceSetup("server", 2, 30.0),  # its setup, not its lease
        "dataset": OnceSetup("dataset", 0, 1.5),  # no history: the default estimate
    }  # on_cuda is an ordinary fixture on sim: in its tests' time
    assert setups["dataset"].cost == 1.5 and setups["server"].cost == 60.0
    assert shard_item("t::x", Request(1), 1.0, once=["server", "dataset", "server"]).once == (
        "dataset",
        "server",
    )


def test_capacity_estimates_a_lease_without_history_from_the_setup_history() -> None:
    # The same setup estimate as sharding: 20 s of setup, then 2 one-second users on 3 devices.
    fixtures = parse_once({"once": {"server": {"device_count": 1}}}, "t", ["sim"])
    tests = [collected(f"t{i}", 1, once=("server",)) for i in range(2)]
    rep = report(tests, "sim", None, {setup_history_id("server"): 20.0}, 1.0,
                 devices_per_runner=4, once=fixtures)  # fmt: skip
    [row] = rep.onces
    assert (row.held, row.from_history) == (21.0, False)


def test_users_of_a_costly_fixture_gather_in_one_shard() -> None:
    items = [*others(), *(user(f"u{i}") for i in range(4))]
    spread = assign(items, 4)  # blind to the setup: one user per shard, four setups
    assert sum(bool(paid(shard, SERVER)) for shard in spread) == 4
    split = assign(items, 4, SERVER)
    holders = [shard for shard in split if paid(shard, SERVER)]
    assert len(holders) == 1 and sum(i.once != () for i in holders[0]) == 4
    costs = sorted(shard_cost(shard, SERVER) for shard in split)
    assert costs == [120.0, 124.0, 130.0, 130.0]  # the holder takes fewer other tests
    assert max(costs) < max(shard_cost(shard, SERVER) for shard in spread)  # 201


def test_a_fixture_the_whole_suite_uses_is_paid_where_the_work_needs_it() -> None:
    # Its users cost more than a shard's share together: they spread, each shard pays.
    items = [user(f"u{i:02d}", 10.0) for i in range(40)]
    split = assign(items, 4, SERVER)
    assert all(paid(shard, SERVER) for shard in split)
    costs = [shard_cost(shard, SERVER) for shard in split]
    assert max(costs) - min(costs) <= 0.10 * max(costs)


def test_a_cheap_fixture_every_test_uses_does_not_keep_a_costly_ones_users_apart() -> None:
    # Every test also uses a cheap fixture: it is paid by every shard, and it does not tie
    # the costly fixture's users to all the rest (which would spread them again).
    setups = {**SERVER, "config": OnceSetup("config", 0, 0.5)}
    items = [ShardItem(i.nodeid, "", 1, i.estimate, once=("config",)) for i in others()]
    items += [user(f"u{i}", once=("config", "server")) for i in range(4)]
    split = assign(items, 4, setups)
    assert sum(bool({"server"} & {s.name for s in paid(shard, setups)}) for shard in split) == 1
    assert all("config" in {s.name for s in paid(shard, setups)} for shard in split)


def test_a_group_that_uses_it_brings_its_setup_where_it_goes() -> None:
    # Two shards loaded 60 and 50: a user goes to the one already paying, when that one is
    # lighter with the setup counted than the other with its new setup.
    items = [ShardItem("a", "", 1, 60.0), user("b", 1.0), ShardItem("c", "", 1, 50.0)]
    setups = {"server": OnceSetup("server", 0, 5.0)}
    split = assign([*items, user("d", 1.0)], 2, setups)
    holders = [[i.nodeid for i in shard] for shard in split if paid(shard, setups)]
    assert holders == [["b", "c", "d"]]


def test_the_budget_counts_the_setups() -> None:
    items = [*others(8), *(user(f"u{i}") for i in range(4))]
    # 84 device-s of tests fit one runner of 1 device in 120 s; with the 100 of the setup, no.
    assert shards_for_budget(items, 120.0, 1) == 1
    assert shards_for_budget(items, 120.0, 1, SERVER) == 2
    with pytest.raises(DevpoolError, match="u0 needs 101 s alone on 1 devices"):
        shards_for_budget(items, 40.0, 1, SERVER)  # a user waits 50 s for its setup


def test_the_fingerprint_covers_who_uses_what_and_the_setups() -> None:
    items = [*others(10), *(user(f"u{i}") for i in range(3))]
    order = [item.nodeid for item in items]
    first = split_suite(order, items, 3, SERVER)
    assert split_suite(order, items, 3, SERVER) == first
    cheaper = {"server": OnceSetup("server", 2, 49.0)}
    assert split_suite(order, items, 3, cheaper).costs != first.costs
    moved = [*items[:-1], user(order[-1], once=())]
    assert split_suite(order, moved, 3, SERVER).costs != first.costs
    # Without once-fixtures, the fingerprint is as before they were counted.
    plain = others(10)
    names = [item.nodeid for item in plain]
    assert split_suite(names, plain, 3, SERVER) == split_suite(names, plain, 3)
    # A test that names a fixture sharding does not charge hashes as one naming none.
    elsewhere = [*plain[:-1], user(names[-1], 10.0, once=("on_cuda",))]
    assert split_suite(names, elsewhere, 3, SERVER) == split_suite(names, plain, 3)


SETUPS = {
    "a": OnceSetup("a", 2, 40.0),
    "b": OnceSetup("b", 0, 5.0),
    "c": OnceSetup("c", 1, 0.0),
}


@st.composite
def suites(draw: st.DrawFn) -> list[ShardItem]:
    count = draw(st.integers(0, 40))
    return [
        ShardItem(
            f"t{i:02d}",
            draw(st.sampled_from(["", "", "g1", "g2", "g3"])),
            draw(st.sampled_from([0, 1, 2, 4])),
            draw(st.sampled_from([0.0, 0.1, 0.5, 0.7, 1.0, 1 / 3, 3.0, 20.0])),
            once=tuple(sorted(draw(st.sets(st.sampled_from(["a", "b", "c", "x"]), max_size=2)))),
        )
        for i in range(count)
    ]


@settings(max_examples=80, deadline=None)
@given(suites(), st.integers(1, 6), st.randoms(use_true_random=False))
def test_any_suite_splits_alike_shuffled_and_each_shard_pays_its_own_setups(
    items: list[ShardItem], shards: int, rng: random.Random
) -> None:
    order = [item.nodeid for item in items]
    first = split_suite(order, items, shards, SETUPS)
    shuffled = rng.sample(items, len(items))
    again = split_suite(rng.sample(order, len(order)), shuffled, shards, SETUPS)
    assert again == first
    assert sorted(n for shard in first.shards for n in shard) == sorted(order)
    by_id = {item.nodeid: item for item in items}
    shard_of = {nodeid: k for k, shard in enumerate(first.shards) for nodeid in shard}
    homes: dict[str, set[int]] = {}
    for item in items:
        homes.setdefault(item.key, set()).add(shard_of[item.nodeid])
    assert all(len(found) == 1 for found in homes.values())  # groups stay whole
    for shard in first.shards:
        members = [by_id[n] for n in shard]
        used = {n for item in members for n in item.once if n in SETUPS}
        tests = sum(item.cost for item in members)
        assert shard_cost(members, SETUPS) == pytest.approx(
            tests + sum(SETUPS[n].cost for n in used)
        )
    # The shards pay each setup at least once, and never more than every group paying its own.
    paid_in_all = sum(shard_cost([by_id[n] for n in shard], SETUPS) for shard in first.shards)
    groups: dict[str, list[ShardItem]] = {}
    for item in items:
        groups.setdefault(item.key, []).append(item)
    each_group_pays = sum(shard_cost(members, SETUPS) for members in groups.values())
    assert shard_cost(items, SETUPS) - 1e-6 <= paid_in_all <= each_group_pays + 1e-6
