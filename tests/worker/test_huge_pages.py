"""A template's memory in huge pages (worker/huge_pages.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from devpool.worker import huge_pages

MAPS = """\
55d0c0000000-55d0c0600000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000500000 rw-p 00000000 00:00 0
7f0000600000-7f0000700000 rw-p 00000000 00:00 0
7f1000000000-7f1000400000 rw-p 00001000 08:01 1234                       /usr/lib/libtorch_cpu.so
7f2000000000-7f2000400000 r--p 00000000 00:00 0
7f3000000000-7f3000400000 rw-s 00000000 00:01 99                         /dev/zero (deleted)
7ffc00000000-7ffc00400000 rw-p 00000000 00:00 0                          [stack]
7f4000100000-7f4000500000 rw-p 00000000 00:00 0
"""


def test_only_whole_huge_pages_of_private_anonymous_memory_are_named() -> None:
    two = huge_pages.HUGE
    assert list(huge_pages.anonymous_ranges(MAPS.splitlines())) == [
        (0x55D0C0000000, 0x55D0C0000000 + 3 * two),  # the heap
        (0x7F0000000000, 0x7F0000000000 + 2 * two),  # an unnamed mapping, its tail left out
        (0x7F4000200000, 0x7F4000400000),  # aligned inwards at both ends
    ]


def test_collapsing_changes_no_value_and_says_how_much_it_did() -> None:
    """In a process of its own: a child forked after the collapse sees what its parent
    holds, and a write in either stays its own (copy-on-write of a huge page)."""
    script = """
import os, sys
from devpool.worker import huge_pages
data = bytearray(os.urandom(16 << 20))
before = bytes(data)
done = huge_pages.collapse()
assert done >= 0
assert bytes(data) == before
pid = os.fork()
if pid == 0:
    ok = bytes(data) == before
    data[12345] ^= 0xFF
    os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0
assert bytes(data) == before
print(done)
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) >= 0
