"""The rank merge (backends/merge.py) over random ranks, outcomes and interleavings.

Invariants: one start, one report per phase and one finish per test, tests in order with no
test's start before the previous test's finish, whatever order the ranks' events arrive
in; a phase passes only if every rank passed it, is skipped only if every rank skipped it,
and otherwise fails naming the ranks; a rank devpool ended reads "ended: ...".
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devpool.backends.failfast import FailFast
from devpool.backends.merge import ENDED, Merge, merge_phase
from devpool.worker import protocol

OUTCOMES = ("passed", "failed", "skipped")


def report(nodeid: str, when: str, outcome: str, rank: int) -> dict[str, Any]:
    longrepr: Any = None
    if outcome == "failed":
        longrepr = f"boom on {rank}"
    elif outcome == "skipped":
        longrepr = ["t.py", 1, f"Skipped: why {rank}"]
    data = pytest.TestReport(nodeid, ("t.py", 0, nodeid), {}, outcome, longrepr, when)._to_json()
    data["sections"] = [["Captured stdout call", f"out {rank}"]]
    return dict(data)


def feed(merge: Merge, rank: int, message: dict[str, Any]) -> list[dict[str, Any]]:
    """One event as a worker's pipe carries it, through the merge; what comes out, as sent."""
    out = merge.feed(rank, protocol.EVENTS.decode_object(dict(message)))
    return [protocol.to_object(event) for event in out]


def stream(rank: int, tests: list[str], phases: dict[str, list[str]]) -> list[dict[str, Any]]:
    """One rank's events for a batch: ready, then per test start, its reports, finish."""
    events: list[dict[str, Any]] = [{"ev": "ready", "pid": rank}]
    for nodeid in tests:
        location = ["t.py", 0, nodeid]
        events.append({"ev": "start", "nodeid": nodeid, "location": location})
        setup = phases[nodeid][rank]
        events.append({"ev": "report", "data": report(nodeid, "setup", setup, rank)})
        if setup == "passed":
            events.append({"ev": "report", "data": report(nodeid, "call", "passed", rank)})
        events.append({"ev": "report", "data": report(nodeid, "teardown", "passed", rank)})
        events.append({"ev": "finish", "nodeid": nodeid, "location": location})
    events.append({"ev": "done", "job": 1, "skipped": []})
    return events


@st.composite
def batches(draw: st.DrawFn) -> tuple[int, list[str], dict[str, list[str]], list[int]]:
    world = draw(st.integers(2, 4))
    tests = [f"t.py::test_{i}" for i in range(draw(st.integers(1, 4)))]
    phases = {
        t: draw(st.lists(st.sampled_from(OUTCOMES), min_size=world, max_size=world)) for t in tests
    }
    total = world * (1 + sum(4 + 1 for _ in tests) + 1)
    order = draw(st.lists(st.integers(0, world - 1), min_size=total * 2, max_size=total * 2))
    return world, tests, phases, order


@settings(max_examples=300, deadline=None)
@given(batches())
def test_any_interleaving_gives_one_ordered_story_per_test(
    batch: tuple[int, list[str], dict[str, list[str]], list[int]],
) -> None:
    world, tests, phases, order = batch
    queues = [stream(rank, tests, phases) for rank in range(world)]
    merge = Merge(world)
    out: list[dict[str, Any]] = []
    for pick in order + [r for r in range(world) for _ in range(len(queues[r]))]:
        if queues[pick]:
            out += feed(merge, pick, queues[pick].pop(0))
    assert [m["ev"] for m in out].count("ready") == 1
    done = {"ev": "done", "job": 1, "skipped": [], "through": 0}
    assert [m for m in out if m["ev"] == "done"] == [done]
    lifecycle = [
        (m["ev"], m.get("nodeid") or m["data"]["nodeid"])
        for m in out
        if m["ev"] in ("start", "report", "finish")
    ]
    expected = []
    for nodeid in tests:
        setups = phases[nodeid]
        expected.append(("start", nodeid))
        expected.append(("report", nodeid))
        if all(o == "passed" for o in setups):
            expected.append(("report", nodeid))  # call runs only after a setup that passed
        expected += [("report", nodeid), ("finish", nodeid)]
    assert lifecycle == expected
    for nodeid in tests:
        setup = next(
            m["data"] for m in out if m["ev"] == "report" and m["data"]["nodeid"] == nodeid
        )
        setups = phases[nodeid]
        if "failed" in setups:
            assert setup["outcome"] == "failed"
            failing = [r for r, o in enumerate(setups) if o == "failed"]
            assert setup["longrepr"].startswith(f"rank {failing[0]}: ") or all(
                f"[rank {r}]" in setup["longrepr"] for r in failing
            )
        elif all(o == "skipped" for o in setups):
            assert setup["outcome"] == "skipped"
        elif "skipped" in setups:
            assert setup["outcome"] == "failed"
            assert "only, ran on" in setup["longrepr"]
        else:
            assert setup["outcome"] == "passed"
        # Captured output comes in one section per rank.
        titles = [title for title, _ in setup["sections"]]
        assert titles == [f"Captured stdout call [rank {r}]" for r in range(world)]


def test_a_rank_ended_by_devpool_completes_the_test_and_reads_ended() -> None:
    merge = Merge(2)
    start = {"ev": "start", "nodeid": "t.py::a", "location": ["t.py", 0, "a"]}
    feed(merge, 0, start)
    feed(merge, 1, start)
    for rank in (0, 1):
        feed(merge, rank, {"ev": "report", "data": report("t.py::a", "setup", "passed", rank)})
    feed(merge, 1, {"ev": "report", "data": report("t.py::a", "call", "failed", 1)})
    feed(merge, 1, {"ev": "report", "data": report("t.py::a", "teardown", "passed", 1)})
    assert feed(merge, 1, {"ev": "finish", "nodeid": "t.py::a", "location": ["t.py", 0, "a"]}) == []
    out = [protocol.to_object(m) for m in merge.end_rank(0, f"{ENDED}rank 1 failed")]
    assert [m["ev"] for m in out] == ["report", "report", "report", "finish"]
    call = out[1]["data"]
    assert call["outcome"] == "failed"
    # The rank's own failure first, the rank devpool ended after it.
    assert call["longrepr"].index("[rank 1] boom on 1") < call["longrepr"].index(
        "[rank 0] ended: rank 1 failed"
    )


def test_a_rank_ended_still_in_its_setup_keeps_the_failing_ranks_call() -> None:
    """On a loaded host rank 0 may not have reported its setup when rank 1's body failed:
    its part is of the body too, and the merged call names rank 1's failure (it read as an
    ERROR at setup saying only that rank 0 was ended, rank 1's failure dropped)."""
    merge = Merge(2)
    start = {"ev": "start", "nodeid": "t.py::a", "location": ["t.py", 0, "a"]}
    feed(merge, 0, start)
    feed(merge, 1, start)
    feed(merge, 1, {"ev": "report", "data": report("t.py::a", "setup", "passed", 1)})
    feed(merge, 1, {"ev": "report", "data": report("t.py::a", "call", "failed", 1)})
    feed(merge, 1, {"ev": "report", "data": report("t.py::a", "teardown", "passed", 1)})
    feed(merge, 1, {"ev": "finish", "nodeid": "t.py::a", "location": ["t.py", 0, "a"]})
    out = [protocol.to_object(m) for m in merge.end_rank(0, f"{ENDED}rank 1 failed")]
    reports = {m["data"]["when"]: m["data"] for m in out if m["ev"] == "report"}
    assert reports["setup"]["outcome"] == "passed"
    assert reports["call"]["outcome"] == "failed"
    assert "[rank 1] boom on 1" in reports["call"]["longrepr"]
    assert "[rank 0] ended: rank 1 failed" in reports["call"]["longrepr"]


def test_a_partial_skip_names_the_ranks_that_skipped() -> None:
    merged = merge_phase(
        [
            (0, report("t.py::a", "call", "passed", 0)),
            (1, report("t.py::a", "call", "skipped", 1)),
            (2, report("t.py::a", "call", "skipped", 2)),
        ]
    )
    assert merged["outcome"] == "failed"
    assert merged["longrepr"].startswith("skipped on ranks 1, 2 only, ran on rank 0")
    assert "[rank 1] Skipped: why 1" in merged["longrepr"]


def test_setup_show_text_is_rank_0s_once_where_rank_0_wrote_it() -> None:
    merge = Merge(2)
    start = {"ev": "start", "nodeid": "t.py::a", "location": ["t.py", 0, "a"]}
    for rank in (0, 1):
        feed(merge, rank, start)
        feed(merge, rank, {"ev": "shown", "text": f"SETUP {rank}"})
        feed(merge, rank, {"ev": "report", "data": report("t.py::a", "setup", "passed", rank)})
        feed(merge, rank, {"ev": "report", "data": report("t.py::a", "call", "passed", rank)})
        feed(merge, rank, {"ev": "shown", "text": f"TEARDOWN {rank}"})
        feed(merge, rank, {"ev": "report", "data": report("t.py::a", "teardown", "passed", rank)})
    out = feed(merge, 0, {"ev": "finish", "nodeid": "t.py::a", "location": ["t.py", 0, "a"]})
    out += feed(merge, 1, {"ev": "finish", "nodeid": "t.py::a", "location": ["t.py", 0, "a"]})
    told = [m.get("text") or m.get("data", {}).get("when") or m["ev"] for m in out]
    assert told == ["SETUP 0", "setup", "call", "TEARDOWN 0", "teardown", "finish"]
    # After its last test (the widest fixtures' teardown), rank 0's text goes out at once.
    assert feed(merge, 0, {"ev": "shown", "text": "TEARDOWN s"}) == [
        {"ev": "shown", "text": "TEARDOWN s"}
    ]
    assert feed(merge, 1, {"ev": "shown", "text": "TEARDOWN s"}) == []


def test_ranks_at_a_debugger_get_the_terminal_in_turn() -> None:
    merge = Merge(3)
    start = {"ev": "start", "nodeid": "t.py::a", "location": ["t.py", 0, "a"]}
    for rank in range(3):
        feed(merge, rank, start)
    asks = [{"ev": "debugger", "pid": 100 + rank} for rank in range(3)]
    assert feed(merge, 1, asks[1]) == [{**asks[1], "post_mortem": False}]
    assert feed(merge, 0, asks[0]) == []  # waits for rank 1's prompt to end
    assert feed(merge, 2, asks[2]) == []
    left = {"ev": "debugger_left", "pid": 101}
    assert feed(merge, 1, left) == [left, {**asks[0], "post_mortem": False}]
    # A rank devpool ends at its prompt gives the terminal to the next.
    out = [protocol.to_object(m) for m in merge.end_rank(0, f"{ENDED}rank 1 failed")]
    assert out[:2] == [{"ev": "debugger_left", "pid": 100}, {**asks[2], "post_mortem": False}]
    quit_ = {"ev": "quit", "msg": "Quitting debugger", "returncode": 2}
    assert feed(merge, 2, quit_) == [quit_]


def test_no_rank_straggles_while_one_sits_at_a_prompt() -> None:
    fate = FailFast(2, straggle=5.0)
    location = ["t.py", 0, "a"]
    for rank in (0, 1):
        fate.take(rank, protocol.Start(nodeid="t.py::a", location=location), 0.0)
    fate.take(0, protocol.Debugger(pid=100), 1.0)
    fate.take(1, protocol.Finish(nodeid="t.py::a", location=location), 1.0)
    assert fate.due() == []
    fate.tick(100.0)
    assert fate.fallen is None and not fate.straggling
    fate.take(0, protocol.DebuggerLeft(pid=100), 100.0)
    assert fate.due() == [105.0]  # the window starts again from the prompt's end
