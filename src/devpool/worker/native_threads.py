"""Threads that C libraries started in this process, which `threading` cannot see.

A template that imported torch and ran a parallel op at import has libgomp's OpenMP pool
running: a child forked from it inherits the pool's state but not its threads, and hangs
on its first parallel op. `threading.enumerate()` lists Python's threads only; the kernel
lists them all (/proc/self/task). A native thread is named by the library whose code is on
its stack (its start routine's frame): each blocked thread's stack pointer is read from
/proc/self/task/TID/syscall, its stack through /proc/self/mem, and return addresses found
there are matched against the executable mappings of shared libraries (/proc/self/maps).

Some pools are safe to fork: OpenBLAS stops its threads before a fork and starts them
again in the child (pthread_atfork). Every other native thread makes a template unsafe.
"""

from __future__ import annotations

import bisect
import os
import re
import struct
import threading
import time
from dataclasses import dataclass

from devpool import procfs

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


def task_ids() -> set[int]:
    """Every thread of this process as the kernel lists it (native ones too); empty where
    /proc cannot be read."""
    try:
        return {int(name) for name in os.listdir("/proc/self/task")}
    except OSError:
        return set()


def thread_count() -> int:
    """Threads of this process, as the kernel counts them (at least the main one)."""
    return max(1, len(task_ids()))


def native_thread_ids() -> list[int]:
    """Live kernel threads of this process that are not Python threads (a thread that has
    just ended may linger in /proc a moment: it is no thread any more)."""
    tasks = task_ids()
    if not tasks:
        return []
    python = {t.native_id for t in threading.enumerate() if t.native_id is not None}
    # After a fork, Python 3.11 keeps the parent's native id on the main thread object.
    python.add(threading.get_native_id())
    return sorted(tid for tid in tasks - python if procfs.alive("self", tid))


class _Code:
    """The executable mappings of shared libraries that say who started a thread, sorted
    for bisection (the ones on every thread's stack left out)."""

    def __init__(self, maps: list[_Mapping]) -> None:
        code = [
            m
            for m in maps
            if "x" in m.perms
            and m.path.startswith("/")
            and not EVERYWHERE.match(os.path.basename(m.path))
        ]
        code.sort(key=lambda m: m.start)
        self.starts = [m.start for m in code]
        self.code = code

    def find(self, address: int) -> str | None:
        index = bisect.bisect_right(self.starts, address) - 1
        if index >= 0 and address < self.code[index].end:
            return self.code[index].path
        return None


def _origin(tid: int, maps: list[_Mapping], code: _Code, memory: int) -> str | None:
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
    # Read through /proc/self/mem: a stack unmapped meanwhile (its thread ended) is an
    # error here, never a crash of the template.
    try:
        raw = os.pread(memory, min(stack.end - sp, SCAN) // 8 * 8, sp)
    except OSError:
        return None
    for (word,) in struct.iter_unpack("<Q", raw):
        path = code.find(word)
        if path is not None:
            return path
    return None


def _name(path: str | None) -> str:
    if path is None:
        return "a library devpool cannot tell"
    base = os.path.basename(path)
    for key, name in KNOWN.items():
        if key in base.lower():
            return name
    return base


def _safe(path: str | None) -> bool:
    return path is not None and FORK_SAFE.search(os.path.basename(path)) is not None


def unsafe_native_threads() -> str:
    """Why this process's native threads make it unsafe to fork ("" when they do not)."""
    tids = native_thread_ids()
    if not tids:
        return ""
    try:
        memory = os.open("/proc/self/mem", os.O_RDONLY)
    except OSError:
        return f"it runs {len(tids)} native thread(s) that threading cannot see"
    try:
        maps = _maps()
        code = _Code(maps)
        origins = {tid: _origin(tid, maps, code, memory) for tid in tids}
        deadline = time.monotonic() + SETTLE
        while None in origins.values() and time.monotonic() < deadline:
            # A pool that just ran spins a while before it blocks (OpenBLAS does): a running
            # thread's stack pointer cannot be read. Look again once it has settled, at the
            # threads still there.
            time.sleep(0.02)
            live = set(native_thread_ids())
            origins = {
                tid: o if o is not None else _origin(tid, maps, code, memory)
                for tid, o in origins.items()
                if tid in live
            }
    except OSError:
        return f"it runs {len(tids)} native thread(s) that threading cannot see"
    finally:
        os.close(memory)
    unsafe = [o for o in origins.values() if not _safe(o)]
    if not unsafe:
        return ""
    names = sorted({_name(o) for o in unsafe})
    return (
        f"it runs {len(unsafe)} native thread(s) that threading cannot see, started by "
        f"{', '.join(names)}: a forked child would hang on its first parallel op "
        "(OMP_NUM_THREADS=1, or no parallel op at import, lets it fork)"
    )
