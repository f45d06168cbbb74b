"""Attempts: the moves an attempt may make, deadlines that belong to it, device checks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from devpool.devices.probes import CONTEXT, DEVICE, FatalPatterns
from devpool.errors import DevpoolError
from devpool.plan.jobs import Job
from devpool.plan.markers import Request
from devpool.run.attempts import ALLOWED, Attempt, State, TransitionError


def _job(timeout: float | None = None) -> Job:
    return Job(1, "t.py::test_a", ("t.py", 1, "test_a"), Request(1, timeout=timeout), 0)


class Record:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def __call__(self, event_type: str, **fields: Any) -> None:
        self.events.append({"type": event_type, **fields})


def test_an_attempt_walks_its_states_and_writes_each_move() -> None:
    emit = Record()
    attempt = Attempt(_job(timeout=5.0), 1)
    for state in (State.LEASED, State.SENT):
        attempt.move(state, emit)
    attempt.start(emit, worker_log_size=10)
    assert attempt.running and attempt.deadline is not None and attempt.output_from == 10
    attempt.move(State.REPORTED, emit)
    assert attempt.deadline is None  # void once it reported
    attempt.move(State.CONCLUDED, emit, outcome="passed")
    assert attempt.final
    assert [e["state"] for e in emit.events] == [
        "leased",
        "sent",
        "started",
        "reported",
        "concluded",
    ]


def test_a_deadline_is_due_only_while_its_attempt_runs() -> None:
    emit = Record()
    attempt = Attempt(_job(timeout=1.0), 1)
    attempt.move(State.SENT, emit)
    assert not attempt.due(1e12)
    attempt.start(emit, 0)
    assert attempt.due(attempt.started + 1.0) and not attempt.due(attempt.started + 0.5)
    attempt.move(State.REPORTED, emit)
    assert not attempt.due(1e12)


@pytest.mark.parametrize("state", list(State))
def test_moves_outside_the_table_are_refused(state: State) -> None:
    emit = Record()
    for target in State:
        attempt = Attempt(_job(), 1)
        attempt.state = state
        if target in ALLOWED[state]:
            attempt.move(target, emit)
            assert attempt.state is target
        else:
            with pytest.raises(TransitionError):
                attempt.move(target, emit)


def test_concluded_is_final_and_requeue_keeps_the_attempt_number() -> None:
    emit = Record()
    attempt = Attempt(_job(), 3)
    attempt.move(State.SENT, emit)
    attempt.requeue(emit, "batched behind a crash")
    assert attempt.state is State.QUEUED and attempt.number == 3 and attempt.requeues == 1
    assert emit.events[-1]["reason"] == "batched behind a crash"
    assert ALLOWED[State.CONCLUDED] == frozenset()


def test_fatal_patterns_come_in_two_kinds() -> None:
    cuda = FatalPatterns.for_platform("cuda", "cuda", None)
    found = cuda.classify("RuntimeError: CUDA error: device-side assert triggered")
    assert found is not None and found.kind == CONTEXT
    found = cuda.classify("NVRM: Xid (PCI:0000:17:00): 79, GPU has fallen off the bus")
    assert found is not None and found.kind == DEVICE
    sim = FatalPatterns.for_platform("sim", "sim", None)
    assert sim.classify("DEVPOOL-SIM-CONTEXT") == sim.classify("x DEVPOOL-SIM-CONTEXT y")
    assert sim.classify("all fine") is None


def test_a_fatal_patterns_table_names_both_kinds_and_a_list_means_device() -> None:
    table = {"sim": {"context": ["poisoned"], "device": ["melted"]}}
    fatal = FatalPatterns.for_platform("sim", "sim", table)
    assert fatal.classify("poisoned").kind == CONTEXT  # type: ignore[union-attr]
    assert fatal.classify("melted").kind == DEVICE  # type: ignore[union-attr]
    listed = FatalPatterns.for_platform("sim", "sim", {"sim": ["melted"]})
    assert listed.classify("melted").kind == DEVICE  # type: ignore[union-attr]
    assert listed.classify("DEVPOOL-SIM-CONTEXT") is None
    with pytest.raises(DevpoolError, match="unknown key 'kernel'"):
        FatalPatterns.for_platform("sim", "sim", {"sim": {"kernel": ["x"]}})


def _check(kind: str, device: int, env: dict[str, str]) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "devpool.devices.devcheck", kind, str(device)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    return done.returncode, done.stdout.strip()


def test_the_sim_health_check_answers_from_its_file(tmp_path: Path) -> None:
    health = tmp_path / "health.json"
    health.write_text(json.dumps({"2": "ECC errors pending"}))
    env = {"DEVPOOL_SIM_HEALTH": str(health), "PATH": "/usr/bin:/bin"}
    assert _check("sim", 1, env) == (0, "sim device answered")
    assert _check("sim", 2, env) == (1, "ECC errors pending")
    assert _check("sim", 2, {"PATH": "/usr/bin:/bin"})[0] == 0
    assert _check("npu-of-the-future", 0, env)[0] == 2  # cannot tell: kept in service
