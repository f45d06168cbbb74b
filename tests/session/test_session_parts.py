"""The controller's neighbours: repeat ids, status letters, pruning run folders, estimates."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from devpool.config import Settings
from devpool.outcomes import RERUN, Outcome
from devpool.session.jobs import repeat_id
from devpool.session.past_runs import read_estimates
from devpool.session.run_folder import RUN_ID, make_run_folder, prune_runs, run_id
from devpool.session.summary import teststatus as status_of


def test_repeat_ids_are_spelled_as_pytest_repeat_does() -> None:
    assert repeat_id("t.py::test_a", 3, 20) == "t.py::test_a[3-20]"
    assert repeat_id("t.py::test_b[x]", 3, 20) == "t.py::test_b[x-3-20]"


def _report(outcome: str = "failed", when: str = "call") -> pytest.TestReport:
    return pytest.TestReport("t.py::test_a", ("t.py", 0, "test_a"), {}, outcome, None, when)


def test_devpool_endings_get_their_own_status_letters() -> None:
    report = _report()
    assert status_of(report) is None  # an ordinary failure is pytest's to show
    report.devpool_outcome = Outcome.TIMEOUT.value  # type: ignore[attr-defined]
    assert status_of(report) == ("timeout", "T", ("TIMEOUT", {"red": True}))
    report.devpool_outcome = RERUN  # type: ignore[attr-defined]
    assert status_of(report) == ("rerun", "R", ("RERUN", {"yellow": True}))
    flaky = _report("passed")
    flaky.devpool_outcome = Outcome.FLAKY.value  # type: ignore[attr-defined]
    assert status_of(flaky) == ("flaky", "K", ("FLAKY", {"red": False, "yellow": True}))


def test_old_run_folders_are_pruned_and_others_left_alone(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    names = [f"20260101-00000{i}-42" for i in range(5)]
    for name in [*names, "mine"]:
        (runs / name).mkdir(parents=True)
    assert RUN_ID.fullmatch(run_id())
    settings = Settings(devices=None, platforms={}, keep_runs=2)
    prune_runs(runs / names[-1], settings)
    assert sorted(p.name for p in runs.iterdir()) == sorted([*names[-2:], "mine"])


def test_run_folders_are_made_private_unless_shared(tmp_path: Path) -> None:
    """0700 whatever the umask (a record names tests, hosts and options), 0750 with
    --devpool-share-runs; a folder that is there already keeps its mode."""
    old = os.umask(0o022)
    try:
        private = make_run_folder(tmp_path / "runs" / "a", Settings(devices=None, platforms={}))
        shared = Settings(devices=None, platforms={}, share_runs=True)
        group = make_run_folder(tmp_path / "runs" / "b", shared)
        (tmp_path / "mine").mkdir(mode=0o755)
        make_run_folder(tmp_path / "mine", Settings(devices=None, platforms={}))
    finally:
        os.umask(old)
    modes = [stat.S_IMODE(path.stat().st_mode) for path in (private, group, tmp_path / "mine")]
    assert modes == [0o700, 0o750, 0o755]


def test_no_history_means_no_estimates(tmp_path: Path) -> None:
    notes: list[str] = []
    assert read_estimates(tmp_path / "history.sqlite", None, notes) == ({}, {})
    assert notes == []
