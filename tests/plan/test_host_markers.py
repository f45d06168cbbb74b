"""ports(n) and resources(name=k) into a Request; their bad forms name the test."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from devpool.devices.inventory import Inventory, resolve_inventory
from devpool.errors import DevpoolError
from devpool.plan.jobs import Job, build_plan
from devpool.plan.markers import Request, request_for

NODEID = "tests/test_x.py::test_z"
DECLARED = {"hccl": 1, "license": 4}


@dataclass
class FakeItem:
    """Just what request_for reads from a pytest.Item."""

    marks: list[pytest.MarkDecorator] = field(default_factory=list)
    nodeid: str = NODEID

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        return next((m.mark for m in self.marks if m.name == name), None)

    def iter_markers(self, name: str | None = None) -> Iterator[pytest.Mark]:
        return (m.mark for m in self.marks if name is None or m.name == name)


def request(*marks: pytest.MarkDecorator) -> Request:
    return request_for(FakeItem(list(marks)), ("sim",), None, DECLARED)  # type: ignore[arg-type]


def error(*marks: pytest.MarkDecorator) -> str:
    with pytest.raises(DevpoolError) as info:
        request(*marks)
    message = str(info.value)
    assert message.startswith(NODEID + ": ") and "\n" not in message, message
    return message


def test_ports_and_resources_are_read() -> None:
    got = request(pytest.mark.ports(2), pytest.mark.resources(license=2, hccl=1))
    assert got.ports == 2 and got.ports_needed == 2
    assert got.resources == (("hccl", 1), ("license", 2))
    assert "2 ports" in got.describe() and "hccl=1" in got.describe()


def test_multi_rank_tests_get_one_port_by_default() -> None:
    assert request(pytest.mark.device_count(2)).ports_needed == 1
    assert request(pytest.mark.nodes(2)).ports_needed == 1
    assert request(pytest.mark.device_count(1)).ports_needed == 0
    assert request().ports_needed == 0
    assert request(pytest.mark.device_count(4), pytest.mark.ports(3)).ports_needed == 3


@pytest.mark.parametrize(
    ("mark", "words"),
    [
        (pytest.mark.ports(0), "ports(0) needs a whole number ≥ 1"),
        (pytest.mark.ports("2"), "needs a whole number"),
        (pytest.mark.ports(), "takes exactly one whole number"),
        (pytest.mark.resources(nccl=1), "unknown resource 'nccl'; declared under"),
        (pytest.mark.resources(hccl=0), "resources(hccl=0) needs a whole number ≥ 1"),
        (pytest.mark.resources(hccl=True), "needs a whole number"),
        (pytest.mark.resources("hccl"), "takes name=count pairs"),
        (pytest.mark.resources(), "takes name=count pairs"),
    ],
)
def test_bad_forms_are_one_sentence_naming_the_test(mark: pytest.MarkDecorator, words: str) -> None:
    assert words in error(mark)


def inventory() -> Inventory:
    from devpool.devices.inventory import BUILTIN_PLATFORMS

    return resolve_inventory("sim:0-3", BUILTIN_PLATFORMS, {})


def test_above_capacity_is_unsatisfiable_not_a_usage_error() -> None:
    jobs = [
        Job(1, "t.py::a", ("t.py", 1, "a"), Request(resources=(("hccl", 2),)), 0),
        Job(2, "t.py::b", ("t.py", 2, "b"), Request(resources=(("hccl", 1),)), 1),
    ]
    plan = build_plan(jobs, inventory(), resources=DECLARED)
    assert [j.nodeid for j in plan.jobs] == ["t.py::b"]
    ((job, reason),) = plan.unsatisfiable
    assert job.nodeid == "t.py::a"
    assert reason == "needs 2 of resource hccl; [tool.devpool.resources] gives it capacity 1"


def test_a_preset_master_port_is_replaced_and_said_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MASTER_PORT", "29500")
    jobs = [Job(i, f"t.py::{i}", ("t.py", i, str(i)), Request(device_count=2), i) for i in range(3)]
    notes = build_plan(jobs, inventory()).notes
    assert len(notes) == 1 and notes[0].startswith("MASTER_PORT=29500 is set")
    assert "instead" in notes[0] and "--devpool-keep-master-port" in notes[0]
    (kept,) = build_plan(jobs, inventory(), keep_master_port=True).notes
    assert "kept" in kept
    monkeypatch.delenv("MASTER_PORT")
    assert build_plan(jobs, inventory()).notes == []


def test_explicit_ports_and_resources_run_in_a_worker_of_their_own() -> None:
    assert Job(1, "a", ("a", 1, "a"), Request(ports=1), 0).fresh
    assert Job(1, "a", ("a", 1, "a"), Request(resources=(("hccl", 1),)), 0).fresh
    assert not Job(1, "a", ("a", 1, "a"), Request(device_count=2), 0).fresh


def test_the_ray_backend_has_no_note_on_resources_ray_holds_them_across_runs() -> None:
    jobs = [Job(1, "t.py::a", ("t.py", 1, "a"), Request(resources=(("hccl", 1),)), 0)]
    assert build_plan(jobs, inventory(), backend="ray", resources=DECLARED).notes == []
