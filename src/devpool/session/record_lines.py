"""The run record's first and last lines as the controller writes them: session_start (who
runs which plan where, with which options, on which Ray cluster), then session_end (the
troubles by outcome, the controller's own CPU seconds)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Protocol

import pytest

from devpool.config import Settings
from devpool.database import shown, shown_args
from devpool.devices.inventory import Inventory
from devpool.plan.jobs import Plan
from devpool.report.record import LiveRecord, RecordWriter, RunRecord
from devpool.report.summary import summarize
from devpool.session import summary
from devpool.session.run_folder import prune_runs


class Recording(Protocol):
    """What the record's first and last lines need from the controller, and its writer."""

    settings: Settings
    inventory: Inventory
    run_id: str
    host: str
    run_dir: Path
    log_dir: Path
    memory: dict[int, int]
    record_path: Path
    record: RecordWriter | None
    live_record: LiveRecord

    def emit(self, event_type: str, **fields: Any) -> None: ...


def start(ctx: Recording, config: pytest.Config, plan: Plan) -> None:
    """Older runs pruned, the record opened, and its session_start line."""
    prune_runs(ctx.run_dir, ctx.settings)
    ctx.record = RecordWriter(ctx.record_path)
    ctx.emit(
        "session_start",
        **session_start(
            ctx.run_id,
            ctx.host,
            ctx.settings,
            ctx.inventory,
            config,
            plan,
            ctx.log_dir,
            ctx.memory,
        ),
    )


def end(ctx: Recording, exitstatus: int) -> None:
    """The session_end line, and the record closed."""
    assert ctx.record is not None
    counts = troubles(ctx.live_record.record)
    # The controller's own CPU seconds (benchmarks/per_test.py: what the run costs per test)
    cpu = round(time.process_time(), 3)
    ctx.emit("session_end", exitstatus=int(exitstatus), troubles=counts, controller_cpu=cpu)
    ctx.record.close()


def session_start(
    run_id: str,
    host: str,
    settings: Settings,
    inventory: Inventory,
    config: pytest.Config,
    plan: Plan,
    log_dir: Path,
    memory: dict[int, int],
) -> dict[str, Any]:
    """The session_start line's fields (a database URL in an option or argument shown
    without its password)."""
    options = {
        name: shown(str(value)) if isinstance(value, (Path, str)) else value
        for name, value in vars(settings).items()
        if name not in ("platforms", "devices")
    }
    return dict(
        run_id=run_id,
        host=host,
        pid=os.getpid(),
        args=shown_args(config.invocation_params.args),
        cwd=str(config.invocation_params.dir),
        platform=inventory.platform.name,
        kind=inventory.platform.kind,
        devices=list(inventory.devices),
        source=inventory.source,
        options=options,
        tests=len(plan.jobs) + len(plan.unsatisfiable),
        planned=[job.display for job in plan.jobs] + [j.display for j, _ in plan.unsatisfiable],
        deselected=summary.deselected_count(config),
        log_dir=str(log_dir),
        memory={str(d): b for d, b in memory.items()},
        **_ray_field(settings),
    )


def _ray_field(settings: Settings) -> dict[str, str]:
    """The Ray cluster a ray-backed run joins, for readers of the record (devpool serve)."""
    if settings.backend != "ray":
        return {}
    from devpool.backends.ray.cluster import cluster_address

    return {"ray_address": cluster_address(settings.ray_address)}


def troubles(record: RunRecord) -> dict[str, int]:
    """session_end's count of the tests that ended in trouble, by outcome."""
    counts: dict[str, int] = {}
    for ending in summarize(record).troubles:
        outcome = ending.job.outcome or "?"
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts
