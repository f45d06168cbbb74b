"""Unit tests for devpool.plan.jobs: what cannot run here and why, and the order of the rest."""

from __future__ import annotations

from devpool.devices.inventory import BUILTIN_PLATFORMS, NO_ACCELERATOR, NO_DEVICES, Inventory
from devpool.plan.jobs import DEFAULT_ESTIMATE, Job, build_plan, unsatisfiable_reason
from devpool.plan.markers import Request

SIM4 = Inventory(BUILTIN_PLATFORMS["sim"], (0, 1, 2, 3), "--devices sim:0-3")


def job(id: int, devices: int, nodes: int = 1, estimate: float = DEFAULT_ESTIMATE) -> Job:
    return Job(
        id=id,
        nodeid=f"test_p.py::test_{id}",
        location=("test_p.py", id, f"test_{id}"),
        request=Request(device_count=devices, nodes=nodes),
        index=id,
        estimate=estimate,
    )


def test_more_devices_than_the_pool_is_unsatisfiable_with_the_pool_named() -> None:
    plan = build_plan([job(0, 1), job(1, 8), job(2, 4)], SIM4)

    assert [j.id for j in plan.jobs] == [2, 0]
    ((unsat, reason),) = plan.unsatisfiable
    assert unsat.id == 1
    assert reason == "needs 8 sim devices; the pool has 4 (sim:0-3)"


def test_several_nodes_on_the_local_backend_is_unsatisfiable() -> None:
    plan = build_plan([job(0, 2, nodes=2)], SIM4, backend="local")

    assert plan.jobs == []
    ((_, reason),) = plan.unsatisfiable
    assert reason == (
        "nodes(2) needs 2 machines, 2 sim devices each; the local backend runs on this one "
        "(use --devpool-backend ray, or ranks(2) for 2 processes here)"
    )
    plan = build_plan([job(0, 0, nodes=3)], SIM4, backend="local")
    ((_, reason),) = plan.unsatisfiable
    assert reason.startswith("nodes(3) needs 3 machines; the local backend"), reason


def test_several_nodes_are_satisfiable_on_ray() -> None:
    plan = build_plan([job(0, 2, nodes=2)], SIM4, backend="ray")

    assert [j.id for j in plan.jobs] == [0]
    assert plan.unsatisfiable == []


def test_the_node_reason_wins_over_the_device_reason() -> None:
    reason = unsatisfiable_reason(Request(device_count=8, nodes=2), SIM4, "local")

    assert reason is not None
    assert "nodes" in reason


def test_a_gapped_pool_is_shown_by_its_ids() -> None:
    inventory = Inventory(BUILTIN_PLATFORMS["cuda"], (0, 2, 5), "--devices cuda:0,2,5")

    reason = unsatisfiable_reason(Request(device_count=4), inventory, "local")

    assert reason == "needs 4 cuda devices; the pool has 3 (cuda:0,2,5)"
    assert unsatisfiable_reason(Request(device_count=3), inventory, "local") is None
    assert unsatisfiable_reason(Request(), inventory, "local") is None


def test_runnable_jobs_are_sorted_by_priority() -> None:
    jobs = [
        job(0, 0, estimate=2.0),  # 1 device-second (a CPU job weighs half)
        job(1, 1, estimate=3.0),  # 3
        job(2, 4, estimate=1.0),  # 4
        job(3, 2, estimate=2.0),  # 4, smaller request than job 2
        job(4, 1, estimate=3.0),  # 3, collected after job 1
    ]

    plan = build_plan(jobs, SIM4)

    assert [j.id for j in plan.jobs] == [2, 3, 1, 4, 0]


def test_estimate_callback_sets_estimates_before_sorting() -> None:
    history = {0: 10.0, 1: 0.5}

    plan = build_plan(
        [job(0, 1), job(1, 4), job(2, 1)],
        SIM4,
        estimate=lambda j: history.get(j.id, DEFAULT_ESTIMATE),
    )

    assert [(j.id, j.estimate) for j in plan.jobs] == [(0, 10.0), (1, 0.5), (2, 1.0)]


def test_an_empty_suite_gives_an_empty_plan() -> None:
    plan = build_plan([], SIM4)

    assert (plan.jobs, plan.unsatisfiable) == ([], [])


def test_last_runs_failures_start_first_and_keep_their_own_order() -> None:
    # --ff / --lf: failures first, among them (and among the rest) the usual order.
    jobs = [
        job(0, 0, estimate=2.0),
        job(1, 4, estimate=1.0),
        job(2, 1, estimate=3.0),
        job(3, 2, estimate=2.0),
        job(4, 0, estimate=1e300),  # an absurd estimate still does not beat a failure
    ]
    for failed in (jobs[0], jobs[2]):
        failed.failed_before = True

    plan = build_plan(jobs, SIM4)

    assert [j.id for j in plan.jobs] == [2, 0, 4, 1, 3]


def test_a_pool_of_no_devices_runs_cpu_jobs_and_says_why_device_jobs_cannot() -> None:
    none = Inventory(NO_DEVICES, (), NO_ACCELERATOR)

    plan = build_plan([job(0, 0), job(1, 1), job(2, 2)], none)

    assert [j.id for j in plan.jobs] == [0]
    assert [reason for _, reason in plan.unsatisfiable] == [
        f"needs 1 device; this session has none ({NO_ACCELERATOR})",
        f"needs 2 devices; this session has none ({NO_ACCELERATOR})",
    ]
