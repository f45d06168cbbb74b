"""Regression guard for benchmarks/memory_makespan.py: sharing by memory stays near its bound."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "memory_makespan.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("memory_makespan", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("seed", [1, 2])
def test_sharing_is_within_ten_percent_of_the_bound_and_beats_whole_devices(seed: int) -> None:
    bench = load()
    jobs = bench.workload(random.Random(seed), 400)
    bound = bench.lower_bound(jobs, 8)
    shared = bench.makespan(jobs, 8, share=True)
    whole = bench.makespan(jobs, 8, share=False)
    assert bound <= shared <= 1.10 * bound
    assert shared < 0.8 * whole
