"""Resize the thread pools a process loaded before its thread budget was set.

A fresh worker reads OMP_NUM_THREADS and its kin when its libraries load. A template forked
from the zygote, and a worker forked from a template, loaded them earlier (the controller's
conftest imported torch; the template preloaded numpy) under another budget: for them the
pools are resized at run time, torch's with `torch.set_num_threads`, the BLAS and OpenMP
libraries' with threadpoolctl. Setting a size starts no thread: a template stays forkable.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping
from typing import Any

BUDGET_ENV = "DEVPOOL_THREADS"  # set beside OMP_NUM_THREADS and its kin (run/threads.py)

# Read at load by the libraries a test suite uses: OpenMP (torch's CPU ops, libgomp,
# libiomp, libomp), the BLAS builds numpy and scipy ship, numexpr, Apple's Accelerate.
# Here, where the controller (run/threads.py) and a Ray node (backends/ray/threads.py) read
# them both.
# The pools a loaded library keeps (threadpoolctl's name for each) and the variable that
# sizes each: apply_budget resizes them in a process that loaded them already.
POOL_VARIABLES = {
    "openmp": "OMP_NUM_THREADS",
    "mkl": "MKL_NUM_THREADS",
    "openblas": "OPENBLAS_NUM_THREADS",
    "blis": "BLIS_NUM_THREADS",
}
THREAD_VARIABLES = (*POOL_VARIABLES.values(), "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


# What apply_budget reads: a fork that reads the same as its template needs no resize.
_VARIABLES = (BUDGET_ENV, *POOL_VARIABLES.values())


def sized_as(environ: Mapping[str, str]) -> tuple[str | None, ...]:
    """The values apply_budget sizes the pools by, in this environment."""
    return tuple(environ.get(name) for name in _VARIABLES)


def thread_count(value: str | None) -> int | None:
    """A thread variable's value as a count; None when unset or not a whole number ≥ 1."""
    value = (value or "").strip()
    return int(value) if value.isdigit() and int(value) >= 1 else None


def _count(name: str) -> int | None:
    return thread_count(os.environ.get(name))


def apply_budget() -> None:
    """Size the pools of libraries loaded already to this process's variables: the user's
    where they set one, else devpool's budget. Nothing when no budget was given."""
    budget = _count(BUDGET_ENV)
    if budget is None:
        return
    openmp = _count(POOL_VARIABLES["openmp"]) or budget
    # Each BLAS by its own variable, else OMP_NUM_THREADS, as the libraries read them: a
    # user's MKL_NUM_THREADS=3 stays 3 while devpool's budget sizes OpenBLAS.
    limits = {api: _count(name) or openmp for api, name in POOL_VARIABLES.items()}
    torch: Any = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "set_num_threads"):
        try:
            if torch.get_num_threads() != openmp:
                torch.set_num_threads(openmp)
        except Exception:  # noqa: BLE001 - a broken or stub torch: its tests will say so
            pass
    if not _loaded_native_pools():
        return
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # an optional resize: the variables still reach new processes
        return
    with contextlib.suppress(Exception):  # a library threadpoolctl cannot drive: leave it
        loaded = ThreadpoolController()  # one scan of the loaded libraries
        for api, size in limits.items():
            pools = loaded.select(internal_api=api)
            if pools.lib_controllers:
                pools.limit(limits=size)


def _loaded_native_pools() -> bool:
    """Whether a module that ships a BLAS or OpenMP pool is loaded (else threadpoolctl's
    scan of every shared library would be wasted on a plain suite)."""
    return any(name in sys.modules for name in ("numpy", "scipy", "torch", "sklearn"))
