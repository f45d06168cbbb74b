"""Conclusions (run/conclusions.py): each attempt's ending recorded once: the live tallies,
the duration history's result or JUnit's earlier attempt, the job_end line, the artifacts."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from devpool.outcomes import Outcome
from devpool.plan.jobs import Job
from devpool.plan.markers import Request
from devpool.report.terminal import file_name
from devpool.run.again import Decision, Why
from devpool.run.attempts import Attempt, State
from devpool.run.conclusions import Conclusions


class Run:
    """The run context as Conclusions reads it; emit keeps every event."""

    def __init__(self, tmp_path: Path, **settings: Any) -> None:
        self.inventory = SimpleNamespace(platform=SimpleNamespace(name="sim"), devices=(0, 1))
        options = {"flaky_result": "pass", "repeat": 1, "keep_artifacts": False, **settings}
        self.settings = SimpleNamespace(**options)
        self.quarantined: dict[str, Any] = {}
        self.repeats: dict[str, list[Any]] = {}
        self.results: list[Any] = []
        self.retried: dict[str, list[Any]] = {}
        self.artifacts_dir = tmp_path / "artifacts"
        self.run_id, self.host, self.memory = "run-1", "here", {}
        self.events: list[dict[str, Any]] = []

    def emit(self, event_type: str, **fields: Any) -> None:
        self.events.append({"type": event_type, **fields})

    def job_end(self) -> dict[str, Any]:
        (end,) = [e for e in self.events if e["type"] == "job_end"]
        return end


def _attempt(number: int = 1, devices: tuple[int, ...] = (1,), started: bool = True) -> Attempt:
    job = Job(7, "t.py::test_a", ("t.py", 1, "test_a"), Request(len(devices) or 1), 0)
    attempt = Attempt(job, number, devices=devices)
    attempt.state = State.REPORTED
    attempt.started_wall = 1000.0 if started else 0.0
    return attempt


def _worker() -> Any:
    return SimpleNamespace(pid=4242, rank_info=[], devices=(1,), log=Path("/logs/w.log"))


def _conclusions(run: Run) -> Conclusions:
    return Conclusions(run, lambda devices: "sim:" + ",".join(map(str, devices)))  # type: ignore[arg-type]


def test_a_final_failure_is_tallied_kept_for_history_and_recorded_as_gating(
    tmp_path: Path,
) -> None:
    run = Run(tmp_path)
    conclusions = _conclusions(run)
    attempt = _attempt()
    attempt.told.append("failed")
    conclusions.conclude(attempt, Outcome.FAILED, _worker(), "assert 1 == 2", None)
    assert conclusions.ended == {"failed": 1} and conclusions.counted == {"failed": 1}
    assert attempt.told == [] and attempt.state is State.CONCLUDED
    (result,) = run.results
    assert (result.nodeid, result.outcome, result.platform) == ("t.py::test_a", "failed", "sim")
    end = run.job_end()
    assert (end["outcome"], end["gating"], end["retried"]) == ("failed", True, False)
    assert (end["devices"], end["worker_pid"], end["detail"]) == ([1], 4242, "assert 1 == 2")
    assert run.retried == {}


def test_an_attempt_that_runs_again_is_an_earlier_attempt_not_an_ending(tmp_path: Path) -> None:
    run = Run(tmp_path)
    conclusions = _conclusions(run)
    attempt = _attempt(number=2)
    attempt.again = Decision(Why.RERUN, spends="failed")
    conclusions.conclude(attempt, Outcome.TIMEOUT, _worker(), "over 5s", None)
    assert conclusions.ended == {} and run.results == []
    (earlier,) = run.retried["t.py::test_a"]
    assert earlier.message == "attempt 2 on sim:1: over 5s"
    end = run.job_end()
    assert end["retried"] is True and end["gating"] is False


def test_an_ending_before_the_start_is_no_earlier_attempt(tmp_path: Path) -> None:
    run = Run(tmp_path)
    attempt = _attempt(started=False)
    attempt.again = Decision(Why.SENT_BACK)
    _conclusions(run).conclude(attempt, Outcome.CRASHED, None, "", None)
    assert run.retried == {}
    assert run.job_end()["detail"] == ""


def test_a_device_test_that_never_got_devices_says_not_started(tmp_path: Path) -> None:
    run = Run(tmp_path)
    attempt = _attempt(devices=())
    _conclusions(run).conclude(attempt, Outcome.INFRA, None, "no lease", None)
    assert run.results == []  # no worker ran it: nothing for the duration history
    attempt = _attempt(number=1, devices=())
    attempt.again = Decision(Why.RERUN_INFRA)
    _conclusions(run).conclude(attempt, Outcome.INFRA, None, "no lease", None)
    assert run.retried["t.py::test_a"][0].message == "attempt 1 on not started: no lease"


def test_quarantine_keeps_a_failure_from_gating_and_flaky_gates_when_asked(tmp_path: Path) -> None:
    run = Run(tmp_path)
    run.quarantined["t.py::test_a"] = SimpleNamespace(describe=lambda: "until 2027 (issue 9)")
    _conclusions(run).conclude(_attempt(), Outcome.FAILED, _worker(), "", None)
    assert run.job_end()["gating"] is False
    assert run.job_end()["quarantined"] == "until 2027 (issue 9)"
    strict = Run(tmp_path, flaky_result="fail")
    _conclusions(strict).conclude(_attempt(), Outcome.FLAKY, _worker(), "", None)
    assert strict.job_end()["gating"] is True
    lenient = Run(tmp_path)
    _conclusions(lenient).conclude(_attempt(), Outcome.FLAKY, _worker(), "", None)
    assert lenient.job_end()["gating"] is False


def test_artifacts_are_kept_for_a_failure_and_removed_after_a_pass(tmp_path: Path) -> None:
    for outcome, kept in ((Outcome.FAILED, True), (Outcome.PASSED, False)):
        run = Run(tmp_path / outcome.value)
        folder = run.artifacts_dir / file_name("t.py::test_a", 1)
        folder.mkdir(parents=True)
        (folder / "image.png").write_bytes(b"x")
        _conclusions(run).conclude(_attempt(), outcome, _worker(), "", None)
        assert folder.is_dir() is kept, outcome
        assert run.job_end()["artifacts"] == (str(folder) if kept else None)


def test_repeats_keep_each_final_ending_and_where_it_ran(tmp_path: Path) -> None:
    run = Run(tmp_path, repeat=3)
    _conclusions(run).conclude(_attempt(), Outcome.PASSED, _worker(), "", None)
    assert run.repeats == {"t.py::test_a": [(Outcome.PASSED, "sim:1")]}
