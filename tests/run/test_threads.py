"""The thread budget's arithmetic and wording (run/threads.py); the e2e test
tests/e2e/test_thread_budget.py shows it reaching real workers."""

from __future__ import annotations

from devpool.devices.cores import Cores
from devpool.run.threads import THREAD_VARIABLES, ThreadBudget


def budget(cores: int, max_parallel: int, slots: int, devices: int, **env: str) -> ThreadBudget:
    return ThreadBudget.of(Cores(cores, cores), max_parallel, slots, devices, env)


def test_the_cores_are_divided_among_the_tests_that_run_at_once() -> None:
    assert budget(64, 64, 64, 8).per_test == 1  # every core a CPU slot: one thread each
    assert budget(64, 8, 8, 8).per_test == 8  # 8 at once on 64 cores
    assert budget(64, 8, 0, 8).per_test == 8
    assert budget(2, 8, 2, 8).per_test == 1  # never below one
    assert budget(16, 16, 2, 0).per_test == 8  # 2 CPU slots, no device


def test_env_sets_every_variable_but_the_users() -> None:
    env = budget(8, 4, 4, 0, OMP_NUM_THREADS="3").env()
    assert "OMP_NUM_THREADS" not in env  # the process inherits the user's own
    assert {env[name] for name in THREAD_VARIABLES if name != "OMP_NUM_THREADS"} == {"2"}
    assert env["DEVPOOL_THREADS"] == "2"
    assert budget(8, 4, 4, 0).env(cpus=6)["OMP_NUM_THREADS"] == "6"


def test_header_says_the_budget_once_and_each_nonsense_variable() -> None:
    plain = budget(8, 4, 4, 0).header()
    assert plain == [
        "devpool: threads: 2 per test (8 cores by affinity, 4 tests at once; cpus(n) gets n); "
        "in OMP_NUM_THREADS and its kin"
    ]
    lines = budget(8, 4, 4, 0, OMP_NUM_THREADS="abc", MKL_NUM_THREADS="2").header()
    assert lines[0].endswith("yours kept: OMP_NUM_THREADS=abc, MKL_NUM_THREADS=2")
    assert len(lines) == 2 and "OMP_NUM_THREADS='abc' is not a whole number" in lines[1]


def test_on_a_ray_cluster_the_nodes_set_the_variables_and_the_header_says_so() -> None:
    cores = Cores(2, 2)
    ray = ThreadBudget.of(cores, 8, 2, 8, {"MKL_NUM_THREADS": "3"}, per_node=True)
    assert ray.env() == {} and ray.env(cpus=2) == {}  # the controller's 2 cores are not a node's
    (line,) = ray.header()
    assert line.startswith("devpool: threads: each Ray node's own cores, ")
    assert "k of its D devices gets cores × k ÷ (D + cpu slots)" in line
    assert "cpus(n) gets n" in line
    assert line.endswith("yours kept: MKL_NUM_THREADS=3")
