"""What a selective queue run selected, for its verdict: "N of M selected", or why all ran.

The first job of a run with --devpool-select on (or shadow) writes it beside the queue's
tables; its other jobs select from the same pinned baseline (select/store_pg.py), so what
the first wrote holds for the run. `devpool queue report` says it under the summary.
"""

from __future__ import annotations

from typing import Any

from devpool.database import connect, driver

_CREATE = """
CREATE TABLE IF NOT EXISTS devpool_queue_selection (
    run_id text PRIMARY KEY,
    mode text NOT NULL,
    selected integer NOT NULL,
    total integer NOT NULL,
    reason text NOT NULL DEFAULT '',
    generation text
)
"""


def note_selection(
    url: str, run_id: str, mode: str, selected: int, total: int, reason: str, generation: str | None
) -> str:
    """Write the run's selection once (the first job's); '' or why it could not be written."""
    try:
        with connect(url) as db:
            db.execute(_CREATE)
            db.execute(
                "INSERT INTO devpool_queue_selection VALUES (%s, %s, %s, %s, %s, %s) "
                "ON CONFLICT DO NOTHING",
                (run_id, mode, selected, total, reason, generation),
            )
    except Exception as exc:  # noqa: BLE001 - a DevpoolError or the driver's: said, not raised
        return f"the selection was not noted for the run's report: {exc}"
    return ""


def selection_line(db: Any, run_id: str) -> tuple[str, bool] | None:
    """The verdict's line for a selective run, and whether it selected nothing on purpose
    (no test a change can affect: no "no tests collected"); None for a run that did not
    select."""
    try:
        made = db.execute("SELECT to_regclass('devpool_queue_selection')").fetchone()
        if made is None or made[0] is None:
            return None
        row = db.execute(
            "SELECT mode, selected, total, reason, generation FROM devpool_queue_selection "
            "WHERE run_id = %s",
            (run_id,),
        ).fetchone()
    except driver().Error:
        return None
    if row is None:
        return None
    mode, selected, total, reason, generation = row
    shadow = " (shadow: all of them ran)" if mode == "shadow" else ""
    if reason:
        return f"devpool select{shadow}: {total} of {total} selected, a full run: {reason}", False
    line = f"devpool select{shadow}: {selected} of {total} selected (baseline {generation})"
    return line, selected == 0 and mode == "on"
