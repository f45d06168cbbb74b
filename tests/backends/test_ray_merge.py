"""The Ray backend's parts that need no cluster: the rank merge, the cluster's description,
the lists shipped to a node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from devpool.backends.merge import Merge, merge_phase
from devpool.backends.ray.actor import MODULES_ENV, shipped_lists
from devpool.backends.ray.cluster import NodeShape, describe_cluster
from devpool.worker import protocol
from devpool.worker.worklist import NODEIDS_ENV as SELECTION_ENV


def _report(outcome: str, when: str = "call", longrepr: str | None = None, **extra: Any) -> dict:
    report = pytest.TestReport(
        "t.py::test_a", ("t.py", 0, "test_a"), {}, outcome, longrepr, when, duration=0.5
    )
    data = dict(report._to_json())  # noqa: SLF001 - the form a worker sends
    data.update(extra)
    return data


def test_a_phase_fails_if_any_rank_failed_and_says_which() -> None:
    merged = merge_phase(
        [
            (0, _report("passed", duration=0.2, sections=[["out", "zero"]])),
            (1, _report("failed", longrepr="boom", duration=0.9)),
        ]
    )
    assert merged["outcome"] == "failed"
    assert merged["longrepr"].startswith("[rank 1] ") and "boom" in merged["longrepr"]
    assert merged["duration"] == 0.9
    assert merged["sections"] == [["out [rank 0]", "zero"]]


def test_a_phase_passes_only_when_every_rank_passed() -> None:
    merged = merge_phase([(0, _report("passed")), (1, _report("passed"))])
    assert merged["outcome"] == "passed"


def _feed(merge: Merge, rank: int, *messages: dict[str, Any]) -> list[dict[str, Any]]:
    """Events as a worker's pipe carries them, through the merge; what comes out, as sent."""
    out: list[dict[str, Any]] = []
    for message in messages:
        event = protocol.EVENTS.decode_object(dict(message))
        out += [protocol.to_object(m) for m in merge.feed(rank, event)]
    return out


def test_two_ranks_make_one_start_one_report_per_phase_and_one_finish() -> None:
    merge = Merge(2)
    start = {"ev": "start", "nodeid": "t.py::test_a", "location": ["t.py", 0, "test_a"]}
    finish = {"ev": "finish", "nodeid": "t.py::test_a", "location": ["t.py", 0, "test_a"]}
    first = _feed(
        merge,
        0,
        {"ev": "ready", "pid": 1},
        start,
        {"ev": "report", "data": _report("passed", "setup")},
        {"ev": "report", "data": _report("passed")},
        finish,
    )
    assert [m["ev"] for m in first] == ["start"]  # ready once every rank is
    second = _feed(
        merge,
        1,
        {"ev": "ready", "pid": 1},
        start,
        {"ev": "report", "data": _report("passed", "setup")},
        {"ev": "report", "data": _report("failed", longrepr="rank one")},
        finish,
    )
    assert [m["ev"] for m in second] == ["ready", "report", "report", "finish"]
    assert [m["data"]["when"] for m in second[1:3]] == ["setup", "call"]
    assert second[2]["data"]["outcome"] == "failed"
    done = _feed(merge, 0, {"ev": "done", "job": 3, "skipped": ["b"]})
    assert done == []
    assert _feed(merge, 1, {"ev": "done", "job": 3, "skipped": ["a"]}) == [
        {"ev": "done", "job": 3, "skipped": ["a", "b"], "through": 0}
    ]


def test_one_rank_passes_every_message_through() -> None:
    message = protocol.Missing(nodeid="t.py::test_a")
    assert Merge(1).feed(0, message) == [message]


def test_the_cluster_is_described_by_node_shape() -> None:
    nodes = [NodeShape("a", "10.0.0.1", 4), NodeShape("b", "10.0.0.2", 4), NodeShape("c", "x", 2)]
    assert describe_cluster(nodes, "NPU") == "2 nodes with 4 NPU, 1 node with 2 NPU"
    assert describe_cluster([], "NPU") == "no alive nodes"


def test_shipped_lists_name_modules_relative_to_the_shipped_folder(tmp_path: Path) -> None:
    modules = tmp_path / "modules.txt"
    modules.write_text(f"{tmp_path / 'tests' / 'test_a.py'}\n")
    selection = tmp_path / "selection.txt"
    selection.write_text("tests/test_a.py::test_one\n\n")
    env = {MODULES_ENV: str(modules), SELECTION_ENV: str(selection)}
    assert shipped_lists(env, tmp_path) == {
        SELECTION_ENV: ["tests/test_a.py::test_one"],
        MODULES_ENV: ["tests/test_a.py"],
    }
    assert shipped_lists({MODULES_ENV: str(tmp_path / "gone.txt")}, tmp_path) == {}
