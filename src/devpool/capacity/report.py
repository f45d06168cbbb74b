"""What a suite costs in devices: collect it (run nothing), count its requests, estimate time.

Every collected test falls in exactly one state, in this order:
  skipped by platform  its platforms marker leaves out the platform of the report;
  disabled             a skip marker, or a skipif marker whose condition is true;
  quarantined          a quarantine marker: it runs, but does not gate;
  enabled              everything else.
Costs and times count the tests that run (enabled and quarantined). A test costs
device_count × nodes × estimate device-seconds; a device_memory test also costs its
declared memory × device_count × nodes × estimate device-memory-seconds (GiB-s). A row's
wall time on a runner of D devices is a lower bound: max(device-seconds / D, CPU seconds / D,
its longest test), since CPU tests run in CPU slots beside the device tests (a runner is
assumed to have a core per device).
The timeline (optional) simulates devpool's own scheduler instead.

The face of the capacity report: collect.py collects, costs.py sums and simulates,
render.py prints.
"""

from __future__ import annotations

from devpool.capacity.collect import (
    CollectedTest,
    Collection,
    apply_quarantine,
    collect,
    collect_suite,
)
from devpool.capacity.costs import (
    DRIFT_SHOWN,
    CapacityReport,
    Drift,
    Row,
    TimelineRow,
    Unrunnable,
    parse_runner_class,
    pool_sizes,
    report,
    simulate,
    size_label,
)
from devpool.capacity.render import (
    CAPACITY_SCHEMA,
    DEVICE_SECONDS,
    render_json,
    render_markdown,
    render_text,
    to_json,
)

__all__ = [
    "CAPACITY_SCHEMA",
    "DEVICE_SECONDS",
    "DRIFT_SHOWN",
    "CapacityReport",
    "CollectedTest",
    "Collection",
    "Drift",
    "Row",
    "TimelineRow",
    "Unrunnable",
    "apply_quarantine",
    "collect",
    "collect_suite",
    "parse_runner_class",
    "pool_sizes",
    "render_json",
    "render_markdown",
    "render_text",
    "report",
    "simulate",
    "size_label",
    "to_json",
]
