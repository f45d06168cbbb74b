"""worker/native_threads.py in fresh processes: what makes a template unsafe to fork."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from openmp_library import build_openmp_library


def verdict(body: str) -> str:
    """What unsafe_native_threads() says in a fresh interpreter after `body` ran."""
    code = textwrap.dedent(body) + (
        "\nfrom devpool.worker.native_threads import unsafe_native_threads\n"
        "print(repr(unsafe_native_threads()))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return str(eval(done.stdout.strip().splitlines()[-1]))  # noqa: S307 - our own repr


def test_python_threads_that_ended_are_no_native_threads() -> None:
    assert (
        verdict(
            """
        import threading
        for _ in range(200):
            thread = threading.Thread(target=lambda: None)
            thread.start()
            thread.join()
        """
        )
        == ""
    )


def test_openblas_pool_restarts_after_fork_so_numpy_is_safe() -> None:
    pytest.importorskip("numpy")
    assert verdict("import numpy\nnumpy.ones((300, 300)) @ numpy.ones((300, 300))\n") == ""


def test_an_openmp_pool_is_named(tmp_path: Path) -> None:
    library = build_openmp_library(tmp_path)
    said = verdict(
        f"""
        import ctypes
        lib = ctypes.CDLL({str(library)!r})
        lib.parallel_sum.restype = ctypes.c_double
        lib.parallel_sum(100000)
        """
    )
    assert "started by libgomp" in said and "hang on its first parallel op" in said, said


def test_a_thread_of_unknown_origin_counts_as_unsafe() -> None:
    """A native thread whose code devpool cannot attribute (here: still running, spinning
    in C through ctypes' libc call) is never taken for safe."""
    said = verdict(
        """
        import ctypes, threading
        libc = ctypes.CDLL(None)
        # A thread started by C, not by Python's threading: pthread_create on sleep(60).
        start = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(lambda _: libc.sleep(60))
        tid = ctypes.c_ulong()
        libc.pthread_create(ctypes.byref(tid), None, start, None)
        import time; time.sleep(0.2)
        """
    )
    assert said.startswith("it runs 1 native thread(s)"), said
