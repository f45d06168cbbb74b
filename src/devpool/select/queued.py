"""Selective runs under the queue (--devpool-queue): what a selecting run tells the queue,
and the one publication of a baseline its jobs recorded together (fleet.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from devpool.errors import DevpoolError
from devpool.queue.classes import gaps as class_gaps
from devpool.queue.selection import note_selection
from devpool.queue.store import QueueStore
from devpool.select.diff import Selection
from devpool.select.fleet import database_of, missing, shapes_of, unpack_parts
from devpool.select.store_pg import PgStore
from devpool.wording import counted


def tell_queue(url: str, run: str, selection: Selection, mode: str, collected: int) -> str:
    """Note the run's selection beside the queue for its report; '' or why not. collected:
    the tests of the bucket (a full run's selection counts none)."""
    total = len(selection.selected) + len(selection.deselected)
    total = collected if selection.full_reason is not None else total
    return note_selection(
        url,
        run,
        mode,
        len(selection.selected),
        total,
        selection.full_reason or "",
        selection.generation,
    )


def publish_when_complete(
    store: PgStore, queue_url: str, run: str, root: Path, manifest: dict[str, Any]
) -> tuple[str | None, str]:
    """The generation of a queue run whose every test ended, published by the job that finds
    it so (once: the others find it published); (its id or None, a note for the terminal).
    DevpoolError when it cannot be published: tests without dependencies, a database away."""
    queue = QueueStore(queue_url, run)
    try:
        rows, jobs = queue.tests(), queue.jobs()
    finally:
        queue.close()
    # A class no live job of it can take is not waited for: it gets no baseline (issue 56).
    gaps = {test: gap for gap in class_gaps(run, rows, jobs) for test in gap.tests}
    waiting = [row for row in rows if row.state != "done" and row.test_id not in gaps]
    if waiting:
        return None, (
            f"this job's tests sent to queue run {run!r}; the job that ends it last publishes "
            f"the baseline ({len(waiting)} of its tests still running or queued)"
        )
    # Tests no job could hold never ran: they are new to the next selection, as at home.
    required = [
        row.test_id
        for row in rows
        if row.state == "done" and not (row.result or {}).get("unsatisfiable")
    ]
    entries, marks = unpack_parts(store.parts(run))
    why = missing(required, entries)
    if why:
        raise DevpoolError(f"queue run {run!r}: {why}")
    database = database_of(root, {test: entries[test] for test in required})
    # Runners of every platform and size that took part read the run's baseline: a
    # generation for each; a class none of whose jobs took its tests gets none, and why.
    platform = manifest["platform"]
    shapes = sorted({*shapes_of(marks), (platform, manifest["shape"]["pool"])})
    covered = {name for name, _ in shapes}
    uncovered = sorted(
        {
            (name, gap.sentence())
            for gap in {id(g): g for g in gaps.values()}.values()
            for name in gap.platforms.split(",")
            if name not in covered
        }
    )
    name = store.write(manifest, database, run=run, shapes=shapes, uncovered=uncovered)
    if name is None:
        return None, f"queue run {run!r}'s baseline was published by another of its jobs"
    said = " and ".join(
        (f"{p} " if len(covered) > 1 else "") + counted(pool, "device") for p, pool in shapes
    )
    none = f"; none for {', '.join(sorted({n for n, _ in uncovered}))}" if uncovered else ""
    return name, (
        f"published queue run {run!r}'s baseline {name} ({len(required)} tests), "
        f"for runners of {said}{none}"
    )
