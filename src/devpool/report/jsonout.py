"""The run as JSON with a versioned schema, for dashboards and scripts."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from devpool.report.record import RunRecord
from devpool.report.summary import NOT_RUN, summarize

REPORT_SCHEMA = "devpool-report/1"


def render_json(record: RunRecord) -> str:
    """Every attempt with its devices and times, and the run's one summary (report.summary):
    counts, every category's tests, how the run ended."""
    summary = summarize(record)
    duration = summary.duration
    data: dict[str, Any] = {
        "schema": REPORT_SCHEMA,
        "run_id": record.start.get("run_id"),
        "platform": record.platform,
        "devices": record.devices,
        "finished": record.finished,
        "exitstatus": record.end.get("exitstatus") if record.end else None,
        "verdict": summary.verdict,
        "damage": record.damage,
        "duration": round(duration, 3),
        "totals": dict(summary.counts()),
        # category → node ids, a test once per report pytest counted ("?": a not-run test an
        # older record does not name)
        "tests": {name: list(ids) for name, ids in summary.tests.items()},
        "interrupted": record.interrupted,
        "not_run": [nodeid for nodeid in summary.tests.get(NOT_RUN, ()) if nodeid != "?"],
        # a queue run's classes that did not run (not taken, or deselected), and its figures
        "class_gaps": [
            {"sentence": g.sentence, "tests": list(g.tests), "deselected": g.deselected}
            for g in summary.gaps
        ],
        "classes": list(summary.classes),
        # share of the run a lease held each device (worker start-up included) ...
        "utilisation": {str(u.device): round(u.share(duration), 4) for u in summary.use},
        # ... and share of the run its tests ran
        "test_utilisation": {str(u.device): round(u.test_share(duration), 4) for u in summary.use},
        # what tests left behind (issue 52): the tests charged, every `leak` line in the order
        # found; leaks_checked false: the run did not look (--devpool-leaks off, older devpool)
        "leaks_checked": summary.leaks_checked,
        "leaked": list(summary.leaked()),
        "leaks": [asdict(leak) for leak in summary.leaks],
        "repeats": [
            {
                "nodeid": row.nodeid,
                "runs": row.runs,
                "passed": row.passed,
                "failed_on": dict(row.failed_on),
            }
            for row in summary.repeats
        ],
        "jobs": [
            {
                "nodeid": job.nodeid,
                "outcome": job.outcome,
                "category": job.shown,
                "devices": job.devices,
                "attempt": job.attempt,
                "start": job.start,
                "end": job.end,
                "run_time": round(job.test_time, 3),
                "held": round(job.run_time, 3),
                "queue_wait": round(job.queue_wait, 3),
                "host": job.host,
                "detail": job.detail,
                "log": job.log,
                "tail": job.tail,
            }
            for job in record.jobs
        ],
    }
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
