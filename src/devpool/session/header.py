"""devpool's lines in pytest's report header: the devices and where they come from, the
parallelism, the lock and log folders, each test process's thread budget."""

from __future__ import annotations

from pathlib import Path

from devpool.config import Settings
from devpool.devices.inventory import Inventory
from devpool.devices.lockdir import LockDir
from devpool.run.threads import ThreadBudget


def report_header(
    settings: Settings,
    inventory: Inventory,
    lock_dir: LockDir,
    log_dir: Path,
    threads: ThreadBudget,
    max_parallel: int,
    capture: str | None,
) -> list[str]:
    """The header lines; capture is pytest's --capture (-s: tests print to worker logs)."""
    lines = [
        f"devpool: {inventory.describe()} from {inventory.source}; "
        f"max-parallel {max_parallel}, cpu slots {settings.cpu_slots}",
        f"devpool: lock dir {lock_dir.path}; logs {log_dir}",
        *threads.header(),
    ]
    if settings.profile_note:  # e.g. CI=true's reruns, said where they come from
        lines.append(f"devpool: {settings.profile_note}")
    if capture in ("no", "tee-sys"):
        # Tests run in workers: what they print live goes to the worker's log, and a
        # reader of plain pytest's -s would look for it here.
        lines.append(
            f"devpool: -s: tests print to their worker's log, not here: "
            f"{log_dir}/worker-N.log (each failure names its worker's log)"
        )
    if not inventory.devices:
        action = "skip" if settings.skip_unsatisfiable else "fail"
        lines[0] = (
            f"devpool: {inventory.source}: CPU tests run, tests that need devices "
            f"{action} as unsatisfiable; max-parallel {max_parallel}, "
            f"cpu slots {settings.cpu_slots}"
        )
    return lines
