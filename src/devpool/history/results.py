"""What a duration history keeps: one test's end in one run (TestResult), its p90, and the
export file that moves results between histories (a header line, then one JSON object a row).

Whatever holds the history (a SQLite file, a PostgreSQL database) keeps these rows alike.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from devpool.errors import DevpoolError
from devpool.folders import made

HISTORY_SCHEMA = 4
EXPORT_FORMAT = "devpool-history"
COUNTED_OUTCOMES = ("passed", "failed", "flaky")


def wall_bound(device_seconds: float, cpu_seconds: float, longest: float, devices: int) -> float:
    """The least wall a suite can take on one runner: its device-seconds (and CPU-seconds)
    spread over the devices, or its longest test."""
    slots = max(devices, 1)
    return max(device_seconds / slots, cpu_seconds / slots, longest)


def results_bound(results: Iterable[TestResult], devices: int) -> float:
    """wall_bound of a run's results."""
    device = cpu = longest = 0.0
    for result in results:
        device += result.duration * result.device_count
        cpu += result.duration if result.device_count == 0 else 0.0
        longest = max(longest, result.duration)
    return wall_bound(device, cpu, longest, devices)


def runner_class(platform: str, pool_size: int, environ: Mapping[str, str] = os.environ) -> str:
    """The runner class a result is filed under: $DEVPOOL_RUNNER_CLASS or '<platform>-<pool>'."""
    return environ.get("DEVPOOL_RUNNER_CLASS") or f"{platform}-{pool_size}"


@dataclass(frozen=True)
class TestResult:
    """One test's end in one run, as the history keeps it."""

    __test__ = False  # not a pytest test class, despite the name

    nodeid: str
    outcome: str
    duration: float
    platform: str
    device_count: int
    runner_class: str  # e.g. "sim-8", "cuda-8": $DEVPOOL_RUNNER_CLASS or f"{platform}-{pool size}"
    time: float  # Unix seconds
    run_id: str = ""
    memory_peak: int | None = None  # bytes, the most on any one device; None: not watched
    cpu_load: float | None = None  # cores kept busy or waiting, on average; None: unmeasured
    leaks: int | None = None  # what it left behind (issue 52): a count; None: not looked for

    def row(self) -> tuple[Any, ...]:
        return (
            self.nodeid,
            self.outcome,
            float(self.duration),
            self.platform,
            int(self.device_count),
            self.runner_class,
            float(self.time),
            self.run_id,
            None if self.memory_peak is None else int(self.memory_peak),
            None if self.cpu_load is None else float(self.cpu_load),
            None if self.leaks is None else int(self.leaks),
        )


_FIELDS = {f.name: f.type for f in fields(TestResult)}


def p90(durations: Iterable[float]) -> float | None:
    """The nearest-rank 90th percentile, None for no durations."""
    ordered = sorted(durations)
    if not ordered:
        return None
    return ordered[max(math.ceil(0.9 * len(ordered)) - 1, 0)]


def p90_by_test(rows: Iterable[tuple[str, float]]) -> dict[str, float]:
    grouped: dict[str, list[float]] = {}
    for nodeid, duration in rows:
        grouped.setdefault(nodeid, []).append(duration)
    return {nodeid: p90(values) or 0.0 for nodeid, values in grouped.items()}


def write_export(out: Path, rows: Iterable[TestResult]) -> int:
    """Results as an export file (header line, then one JSON object a row); returns the rows.

    Written to a temporary name and renamed, so a reader never sees half a file.
    """
    rows = list(rows)
    header = {"format": EXPORT_FORMAT, "schema": HISTORY_SCHEMA, "rows": len(rows)}
    partial = out.with_name(f".{out.name}.{os.getpid()}.part")
    try:
        made(out.parent)
        with open(partial, "w", encoding="utf-8") as file:
            file.write(json.dumps(header) + "\n")
            for result in rows:
                file.write(json.dumps(asdict(result), ensure_ascii=False) + "\n")
        os.replace(partial, out)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise DevpoolError(f"cannot write history export {out}: {exc.strerror or exc}") from None
    return len(rows)


def read_export(source: Path) -> Iterator[TestResult]:
    try:
        text = source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DevpoolError(f"cannot read {source} as a history export: {exc}") from None
    lines = text.splitlines()
    header = _json_object(lines[0]) if lines else None
    if header is None or header.get("format") != EXPORT_FORMAT:
        raise DevpoolError(
            f"{source} is not a devpool history export (its first line is no "
            f'{{"format": "{EXPORT_FORMAT}", ...}} header)'
        )
    schema = header.get("schema")
    if not isinstance(schema, int) or isinstance(schema, bool) or schema < 1:
        raise DevpoolError(f"{source} is not a devpool history export (schema {schema!r})")
    if schema > HISTORY_SCHEMA:
        raise DevpoolError(
            f"{source} was written by a newer devpool (schema {schema}); "
            f"this one reads {HISTORY_SCHEMA}"
        )
    for number, line in enumerate(lines[1:], 2):
        if not line.strip():
            continue
        result = _result(_json_object(line))
        if result is None:
            raise DevpoolError(
                f"{source} line {number} is not a devpool history row "
                f"(expected an object with {', '.join(_FIELDS)})"
            )
        yield result


def _json_object(line: str) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _result(row: dict[str, Any] | None) -> TestResult | None:
    if row is None:
        return None
    try:
        nodeid, outcome, platform, runner, run_id = (
            row["nodeid"],
            row["outcome"],
            row["platform"],
            row["runner_class"],
            row.get("run_id", ""),
        )
        duration, when, count = row["duration"], row["time"], row["device_count"]
        peak = row.get("memory_peak")  # absent in schema 1 exports
        load = row.get("cpu_load")  # absent before schema 3
        leaks = row.get("leaks")  # absent before schema 4
    except KeyError:
        return None
    texts_ok = all(isinstance(v, str) for v in (nodeid, outcome, platform, runner, run_id))
    numbers_ok = all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in (duration, when)
    )
    count_ok = isinstance(count, int) and not isinstance(count, bool) and count >= 0
    peak_ok = peak is None or (isinstance(peak, int) and not isinstance(peak, bool) and peak >= 0)
    load_ok = load is None or (
        isinstance(load, (int, float)) and not isinstance(load, bool) and load >= 0
    )
    leaks_ok = leaks is None or (
        isinstance(leaks, int) and not isinstance(leaks, bool) and leaks >= 0
    )
    if not (texts_ok and numbers_ok and count_ok and peak_ok and load_ok and leaks_ok):
        return None
    if duration < 0:
        return None
    return TestResult(
        nodeid,
        outcome,
        float(duration),
        platform,
        count,
        runner,
        float(when),
        run_id,
        peak,
        None if load is None else float(load),
        leaks,
    )
