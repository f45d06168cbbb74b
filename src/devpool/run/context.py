"""The narrow interface between the event loop and the controller that runs it.

The loop reads the session's settings, devices and collected items through it, and
hands back what the end-of-run summary needs. It never imports the controller.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import pytest

from devpool.config import Settings
from devpool.devices.inventory import Inventory
from devpool.devices.lockdir import LockDir
from devpool.devices.probes import FatalPatterns, Probe
from devpool.history.durations import TestResult
from devpool.history.location import HistorySpec
from devpool.history.quarantine import Entry
from devpool.outcomes import Outcome
from devpool.report.junit import EarlierAttempt
from devpool.run.threads import ThreadBudget


class RunContext(Protocol):
    """What one run of the loop needs from the session, and where it leaves its findings."""

    settings: Settings
    inventory: Inventory
    lock_dir: LockDir
    run_id: str
    host: str
    run_dir: Path
    history_path: HistorySpec  # a file, or a PostgreSQL URL
    preload_file: Path  # what each kind's templates import first (history/preload.py)
    log_dir: Path
    artifacts_dir: Path
    items: dict[str, pytest.Item]
    probe: Probe | None
    fatal: FatalPatterns
    quarantined: dict[str, Entry]
    memory: dict[int, int]  # bytes each device hands out to device_memory tests ({}: none)
    threads: ThreadBudget  # each test process's share of the cores (OMP_NUM_THREADS, ...)

    # Findings, for the summary at the end of the run.
    repeats: dict[str, list[tuple[Outcome, str]]]
    results: list[TestResult]
    retried: dict[str, list[EarlierAttempt]]
    bad_devices: dict[int, str]  # device → why it was retired
    device_notes: list[str]  # devices that were checked after an error and kept, and why
    startup_estimate: float  # seconds a worker template is expected to take to collect
    run_notes: list[str]  # how the run went otherwise, said once at its end (fork server)
    imported: dict[int, dict[str, None]]  # kind → library modules its tests imported

    def emit(self, event_type: str, **fields: Any) -> None: ...

    def flush_record(self) -> None: ...
