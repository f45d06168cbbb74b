"""A once-fixture's lease in `devpool capacity` (issue 57): its device-seconds and its
held time count in the totals' device-s and wall, and in the timeline; from the duration
history where a run wrote them, else estimated from its users."""

from __future__ import annotations

import json

import pytest
from test_capacity import collected

from devpool.capacity.costs import report
from devpool.capacity.render import render_json, render_markdown, render_text
from devpool.plan.once import history_id, parse_once

ONCE = parse_once({"once": {"server": {"device_count": 1}, "cpu_only": {}}}, "t", ["sim"])


def users(count: int, once: tuple[str, ...] = ("server",)) -> list[object]:
    return [collected(f"t{i}", 1, once=once) for i in range(count)]


def test_its_lease_counts_in_the_totals_from_the_history() -> None:
    tests = [*users(4), collected("other", 1)]
    without = report(tests, "sim", None, {}, 1.0, devices_per_runner=4)
    rep = report(tests, "sim", None, {history_id("server"): 30.0}, 1.0, devices_per_runner=4,
                 once=ONCE)  # fmt: skip
    [row] = rep.onces  # cpu_only: no test uses it, no row
    assert (row.name, row.users, row.held, row.from_history) == ("server", 4, 30.0, True)
    assert rep.totals.device_seconds == without.totals.device_seconds + 30.0
    assert rep.totals.wall == pytest.approx(30.0)  # it is up at least as long as its lease
    assert rep.totals.enabled == without.totals.enabled  # a lease, no test
    text = render_text(rep)
    assert "server: 1 device held 30.0 s (history), 30.0 device-s; 4 tests use it" in text
    assert "server: 1 device held" in render_markdown(rep)
    [data] = json.loads(render_json(rep))["once"]
    assert data["device_seconds"] == 30.0 and data["users"] == 4


def test_without_history_it_is_held_for_its_setup_and_its_users() -> None:
    # 6 one-second users on the 3 devices it leaves: 2 s, after a setup at the default 1 s.
    rep = report(users(6), "sim", None, {}, 1.0, devices_per_runner=4, once=ONCE)
    [row] = rep.onces
    assert (row.held, row.from_history) == (3.0, False)
    cpu = report(users(2, ("cpu_only",)), "sim", None, {}, 1.0, devices_per_runner=4, once=ONCE)
    [row] = cpu.onces
    assert row.device_seconds == 0.0 and cpu.totals.cpu_seconds == row.held  # a CPU slot


def test_the_timeline_keeps_its_device_for_its_lease() -> None:
    rep = report(users(2), "sim", None, {history_id("server"): 10.0}, 1.0,
                 devices_per_runner=2, timeline=True, once=ONCE)  # fmt: skip
    assert rep.timeline is not None
    by_pool = {t.devices: t for t in rep.timeline}
    assert by_pool[2].makespan == pytest.approx(10.0) and by_pool[2].tests == 2
    assert by_pool[1].makespan == pytest.approx(2.0)  # no room for it: ordinary fixtures


def test_collection_finds_the_table_and_the_marked_fixtures_a_test_uses(
    pytester: pytest.Pytester,
) -> None:
    from devpool.capacity.collect import collect_suite
    from devpool.plan.once import CODE, TABLE

    pytester.makepyprojecttoml("[tool.devpool.once]\ndataset = {}\n")
    pytester.makeconftest(
        """
        import devpool
        import pytest


        @devpool.once(device_count=1)
        @pytest.fixture(scope="session")
        def server():
            return 1


        @pytest.fixture(scope="session")
        def dataset():
            return 2
        """
    )
    pytester.makepyfile(
        "def test_both(server, dataset):\n    pass\n\n\ndef test_none():\n    pass\n"
    )
    seen = collect_suite([str(pytester.path), "-p", "no:hypothesispytest"])
    assert {t.nodeid.split("::")[-1]: set(t.once) for t in seen.tests} == {
        "test_both": {"server", "dataset"},
        "test_none": set(),
    }
    sources = {f.name: (f.source, f.request.device_count) for f in seen.once}
    assert sources == {"dataset": (TABLE, 0), "server": (CODE, 1)}
