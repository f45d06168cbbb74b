"""Threads that C libraries started in this process, which `threading` cannot see.

A template that imported torch and ran a parallel op at import has libgomp's OpenMP pool
running: a child forked from it inherits the pool's state but not its threads, and hangs
on its first parallel op. `threading.enumerate()` lists Python's threads only; the kernel
lists them all (/proc/self/task). A native thread is named by the library whose code is on
its stack (its start routine's frame): each blocked thread's stack pointer is read from
/proc/self/task/TID/syscall, and return addresses found on the stack are matched against
the executable mappings of shared libraries (/proc/self/maps).

Some pools are safe to fork: OpenBLAS stops its threads before a fork and starts them
again in the child (pthread_atfork). Every other native thread makes a template unsafe.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import threading
import time
from dataclasses import dataclass

SETTLE = 0.5  # seconds a spinning pool is given to block before it counts as unknown
SCAN = 64 * 1024  # bytes of a thread's stack searched for a library's return address
# Pools that survive fork: they stop their threads before it and restart them in the child.
FORK_SAFE = re.compile(r"openblas", re.IGNORECASE)
# Whose frames are on every thread's stack: they say nothing about who started it.
EVERYWHERE = re.compile(r"^(libc|libpthread|ld-linux|libstdc\+\+|libgcc_s|libpython|python)[.0-9-]")
KNOWN = {
    "gomp": "libgomp (GNU OpenMP, e.g. torch's CPU ops)",
    "iomp": "libiomp5 (Intel OpenMP)",
    "libomp": "libomp (LLVM OpenMP)",
    "mkl": "MKL",
    "tokenizers": "tokenizers' thread pool",
}


@dataclass(frozen=True)
class _Mapping:
    start: int
    end: int
    perms: str
    path: str


def _maps() -> list[_Mapping]:
    found = []
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
        for line in maps:
            parts = line.split(maxsplit=5)
            if len(parts) < 5:
                continue
            start, end = (int(x, 16) for x in parts[0].split("-"))
            path = parts[5].strip() if len(parts) == 6 else ""
            found.append(_Mapping(start, end, parts[1], path))
    return found


def native_thread_ids() -> list[int]:
    """Kernel threads of this process that are not Python threads."""
    try:
        tasks = {int(name) for name in os.listdir("/proc/self/task")}
    except OSError:
        return []
    python = {t.native_id for t in threading.enumerate() if t.native_id is not None}
    return sorted(tasks - python)


def _origin(tid: int, maps: list[_Mapping]) -> str | None:
    """The shared library whose code the thread's stack returns into, or None."""
    try:
        with open(f"/proc/self/task/{tid}/syscall", encoding="ascii") as handle:
            fields = handle.read().split()
    except OSError:
        return None
    if len(fields) < 3 or fields[0] == "running":
        return None
    sp = int(fields[-2], 16)  # the stack pointer, then the program counter
    stack = next((m for m in maps if m.start <= sp < m.end and "r" in m.perms), None)
    if stack is None:
        return None
    code = [m for m in maps if "x" in m.perms and m.path.startswith("/")]
    count = min(stack.end - sp, SCAN) // 8
    words = (ctypes.c_uint64 * count).from_address(sp)
    for word in words:
        for mapping in code:
            base = os.path.basename(mapping.path)
            if mapping.start <= word < mapping.end and not EVERYWHERE.match(base):
                return mapping.path
    return None


def _name(path: str | None) -> str:
    if path is None:
        return "a library devpool cannot tell"
    base = os.path.basename(path)
    for key, name in KNOWN.items():
        if key in base.lower():
            return name
    return base


def unsafe_native_threads() -> str:
    """Why this process's native threads make it unsafe to fork ("" when they do not)."""
    tids = native_thread_ids()
    if not tids:
        return ""
    with contextlib.suppress(OSError):
        maps = _maps()
        origins = [_origin(tid, maps) for tid in tids]
        deadline = time.monotonic() + SETTLE
        while None in origins and time.monotonic() < deadline:
            # A pool that just ran spins a while before it blocks (OpenBLAS does): a running
            # thread's stack pointer cannot be read. Look again once it has settled.
            time.sleep(0.02)
            pairs = zip(tids, origins, strict=True)
            origins = [o if o is not None else _origin(t, maps) for t, o in pairs]
        unsafe = [o for o in origins if o is None or not FORK_SAFE.search(o)]
        if not unsafe:
            return ""
        names = sorted({_name(o) for o in unsafe})
        return (
            f"it runs {len(unsafe)} native thread(s) that threading cannot see, started by "
            f"{', '.join(names)}: a forked child would hang on its first parallel op "
            "(OMP_NUM_THREADS=1, or no parallel op at import, lets it fork)"
        )
    return f"it runs {len(tids)} native thread(s) that threading cannot see"
