"""syrupy: snapshot usage is the whole run's, merged in the controller, never one worker's.

Each worker runs a share of the tests; alone, it would call every snapshot of the others
unused (and delete them under --snapshot-update), and the controller, which runs none,
would call them all unused. syrupy already merges worker reports for pytest-xdist: a
worker publishes its usage in `config.workeroutput` when it believes it is an xdist worker
(PYTEST_XDIST_WORKER), and the controller merges what it is given. devpool uses that API:
a worker is named an xdist worker only while its session ends (its writes then take
syrupy's file lock, as workers share .ambr files), and the controller merges every
worker's report with its own record of what was selected and how each test ended, which
is plain pytest's.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import pytest

from devpool.compat import outputs

_REPORT = "syrupy_report"
_SIDECARS = "syrupy_write_sidecars"


def _state(config: pytest.Config) -> Any:
    return getattr(config, "_syrupy", None)


def _merges(state: Any) -> bool:
    """Whether this syrupy merges worker reports (7.0 and later)."""
    return hasattr(state, "add_worker_report") and hasattr(state, "_selected_items")


@contextlib.contextmanager
def worker_finishing(config: pytest.Config) -> Iterator[None]:
    """Around a worker's pytest_sessionfinish: syrupy writes under its lock and publishes."""
    if not _merges(_state(config)):
        yield
        return
    before = os.environ.get("PYTEST_XDIST_WORKER")
    os.environ["PYTEST_XDIST_WORKER"] = f"devpool-{os.getpid()}"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYTEST_XDIST_WORKER", None)
        else:
            os.environ["PYTEST_XDIST_WORKER"] = before


def controller_finishing(config: pytest.Config) -> tuple[list[str], list[str]]:
    """Before syrupy's pytest_sessionfinish in the controller: give it every worker's report.

    Returns (snapshot files whose lock sidecars to remove afterwards, lines for the summary).
    """
    state = _state(config)
    if state is None:
        return [], []
    if not _merges(state):
        # An older syrupy: the controller would find every snapshot unused. Keep them all.
        if hasattr(config.option, "disable_unused_snapshots"):
            config.option.disable_unused_snapshots = True
        line = "syrupy before 7.0 cannot merge workers' snapshot usage: unused snapshots "
        return [], [line + "were not checked (none removed); syrupy>=7 checks them"]
    found = outputs.of(config)
    reports = [output[_REPORT] for output in found.received if _REPORT in output]
    sidecars = sorted({path for output in found.received for path in output.get(_SIDECARS, ())})
    lines = []
    if found.lost and not getattr(config.option, "disable_unused_snapshots", False):
        config.option.disable_unused_snapshots = True  # a lost worker's usage is unknown
        lines.append(
            f"syrupy: {found.lost} worker(s) ended without their snapshot report (crashed or "
            "killed): unused snapshots were not checked, and none was removed"
        )
    # Which tests were selected and how each ended: the controller's own record (it replayed
    # every report), exactly what plain pytest's syrupy would hold.
    own = {nodeid: status.value for nodeid, status in state._selected_items.items()}  # noqa: SLF001
    for number, report in enumerate(reports):
        state.add_worker_report({**report, "selected": own if number == 0 else {}})
    if sidecars:
        state.add_written_snapshot_locations(sidecars)
    return sidecars, lines


def controller_finished(config: pytest.Config, sidecars: list[str]) -> None:
    """syrupy's controller cleans lock sidecars only under xdist's -n; devpool's does it here."""
    if not sidecars:
        return
    try:
        from syrupy.utils import cleanup_snapshot_write_sidecars
    except ImportError:
        return
    cleanup_snapshot_write_sidecars(*sidecars)
