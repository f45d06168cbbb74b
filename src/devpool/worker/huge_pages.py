"""A template's memory in huge pages, so that a fork copies less of it.

A fork copies the page table of every private page its parent has touched: for a template
that imported torch, about 200 MB of heap, 50,000 entries, each set copy-on-write in the
parent and the child and undone again at the child's exit. Backed by transparent huge
pages, the same memory is 100 entries of 2 MiB; a child's first write to one splits it
into small pages of its own (the kernel's copy-on-write of a shared huge page), so a child
still copies only what it writes. Measured on this project's 2-core host, a fork and exit
of a process with torch imported: 4.0-5.3 ms of CPU, 2.2-2.7 ms with its memory collapsed
(benchmarks/README.md, "job isolation at a fork's cost").

Linux 6.1 and later collapse a range on request (MADV_COLLAPSE), whatever the system's
THP setting; elsewhere, or where the kernel declines, nothing changes.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Iterable, Iterator

MADV_COLLAPSE = 25  # linux/mman.h, Linux 6.1
HUGE = 2 << 20  # a PMD's span on x86-64 and arm64 (4 KiB pages)


def anonymous_ranges(maps: Iterable[str]) -> Iterator[tuple[int, int]]:
    """The whole huge pages inside this process's private anonymous memory (the heap and
    unnamed mappings), from /proc/self/maps' lines: (start, end), aligned to HUGE."""
    for line in maps:
        parts = line.split()
        if len(parts) < 5 or not parts[1].startswith("rw") or parts[1][3] != "p":
            continue
        if len(parts) > 5 and parts[5] != "[heap]":
            continue  # a file, a stack, a special mapping
        low, high = (int(x, 16) for x in parts[0].split("-"))
        start = (low + HUGE - 1) & ~(HUGE - 1)
        end = high & ~(HUGE - 1)
        if end > start:
            yield start, end


def collapse() -> int:
    """Back this process's anonymous memory with huge pages where the kernel can: the
    bytes it collapsed (0 where it cannot; never an error)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
        with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
            lines = maps.read().splitlines()
    except (OSError, AttributeError):
        return 0
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    done = 0
    for start, end in anonymous_ranges(lines):
        if madvise(start, end - start, MADV_COLLAPSE) == 0:
            done += end - start
    return done
