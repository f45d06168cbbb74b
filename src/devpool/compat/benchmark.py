"""pytest-benchmark: benchmarks run in workers, their table and files come from the controller.

Under pytest-xdist pytest-benchmark turns itself off. devpool runs it: each benchmark test
runs with nothing else of the run beside it (plan/markers.py asks for that: a quiet test),
its worker keeps its measurements instead of writing files, and the controller, given
every worker's, prints the one table and writes --benchmark-json / --benchmark-save with
all of them, in collection order.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from devpool.compat import outputs

_KEY = "devpool_benchmarks"
_FIELDS = ("name", "fullname", "group", "param", "params", "extra_info", "iterations")


def _session(config: pytest.Config) -> Any:
    return getattr(config, "_benchmarksession", None)


def active(config: pytest.Config) -> bool:
    bench = _session(config)
    return bench is not None and not bench.disabled and not bench.skip


def is_benchmark(item: pytest.Item) -> bool:
    """The test measures time with the benchmark fixture: it runs with no neighbour."""
    return "benchmark" in getattr(item, "fixturenames", ()) and active(item.config)


def quiet_worker(config: pytest.Config) -> None:
    """A worker measures; only the controller, which has every benchmark, writes files."""
    bench = _session(config)
    if bench is None:
        return
    bench.json = None
    bench.save = bench.autosave = None


def worker_finished(config: pytest.Config, output: dict[str, Any]) -> None:
    """After a worker's pytest_sessionfinish: its measurements go into its output."""
    bench = _session(config)
    if bench is None or not bench.benchmarks:
        return
    kept = []
    for metadata in bench.benchmarks:
        options = dict(metadata.options)
        entry = {name: getattr(metadata, name) for name in _FIELDS}
        entry.update(data=list(metadata.stats.data), has_error=bool(metadata.has_error))
        try:
            pickle.dumps(options)
        except (pickle.PicklingError, TypeError, AttributeError):
            options = {
                k: getattr(v, "__name__", repr(v)) if callable(v) else v for k, v in options.items()
            }
        entry["options"] = options
        try:
            pickle.dumps(entry)
        except (pickle.PicklingError, TypeError, AttributeError):
            entry["params"] = entry["param"] = None  # parameters of a kind pickle cannot carry
            entry["extra_info"] = {k: repr(v) for k, v in dict(entry["extra_info"]).items()}
        kept.append(entry)
    output[_KEY] = kept


def controller_finishing(config: pytest.Config, items: Sequence[pytest.Item]) -> None:
    """Before pytest-benchmark's pytest_sessionfinish: every worker's benchmarks, in the
    order the tests were collected (plain pytest runs them in that order)."""
    bench = _session(config)
    if bench is None:
        return
    from pytest_benchmark import stats

    order = {item.nodeid: index for index, item in enumerate(items)}
    entries = [e for output in outputs.of(config).received for e in output.get(_KEY, ())]
    entries.sort(key=lambda e: order.get(e["fullname"], len(order)))
    for entry in entries:
        metadata: Any = stats.Metadata.__new__(stats.Metadata)
        for name in _FIELDS:
            setattr(metadata, name, entry[name])
        metadata.options = entry["options"]
        metadata.cprofile_stats = None  # cProfile output stays in the worker (its files)
        metadata.stats = stats.Stats()  # type: ignore[no-untyped-call]
        for value in entry["data"]:
            metadata.stats.update(value)
        metadata.fixture = SimpleNamespace(has_error=entry["has_error"])
        bench.benchmarks.append(metadata)
