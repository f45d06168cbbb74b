"""devpool.worker.stacks: faulthandler dumps folded to the frames a person needs."""

from __future__ import annotations

from pathlib import Path

import pluggy
import pytest

import devpool
from devpool.worker.stacks import readable_stacks

SITE = str(Path(pytest.__file__).parent.parent)
PLUGGY = str(Path(pluggy.__file__).parent)
DEVPOOL = str(Path(devpool.__file__).parent)


def dump(test_file: Path) -> str:
    return "\n".join(
        [
            "---- worker output during this test (tail) ----",
            "hello",
            "---- stacks at the timeout (faulthandler) ----",
            "Current thread 0x00007f0e2ce4bb80 (most recent call first):",
            f'  File "{test_file}", line 2 in hang_here',
            f'  File "{test_file}", line 6 in test_hang',
            f'  File "{SITE}/_pytest/python.py", line 166 in pytest_pyfunc_call',
            f'  File "{PLUGGY}/_callers.py", line 121 in _multicall',
            f'  File "{DEVPOOL}/worker/worker_role.py", line 147 in _run',
            f'  File "{SITE}/pytest/__main__.py", line 9 in <module>',
            '  File "<frozen runpy>", line 88 in _run_code',
            "",
            "Thread 0x00007f304eab26c0 (most recent call first):",
            f'  File "{SITE}/threading.py", line 320 in wait',
        ]
    )


def test_machinery_folds_and_the_test_thread_comes_last(tmp_path: Path) -> None:
    test_file = tmp_path / "test_t.py"
    source = "def hang_here():\n    block_forever()\n\n\ndef test_hang():\n    hang_here()\n"
    test_file.write_text(source)
    lines = readable_stacks(dump(test_file)).splitlines()
    assert lines[:3] == [
        "---- worker output during this test (tail) ----",
        "hello",
        "---- stacks at the timeout (faulthandler) ----",
    ]
    current = lines.index("Current thread 0x00007f0e2ce4bb80 (most recent call first):")
    assert lines[3].startswith("Thread 0x00007f304eab26c0") and current > 3
    assert lines[current + 1 :] == [
        f'  File "{test_file}", line 2 in hang_here',
        "    block_forever()",
        f'  File "{test_file}", line 6 in test_hang',
        "    hang_here()",
        "  (5 frames of pytest, pluggy and devpool)",
    ]


def test_text_without_a_dump_is_left_alone() -> None:
    text = 'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\nboom'
    assert readable_stacks(text) == text


def test_every_ranks_dump_folds_alike_and_recursion_is_said_once(tmp_path: Path) -> None:
    test_file = tmp_path / "test_t.py"
    test_file.write_text("def deep(n):\n    deep(n - 1)\n")
    machinery = [
        f'  File "{SITE}/_pytest/python.py", line 166 in pytest_pyfunc_call',
        f'  File "{PLUGGY}/_callers.py", line 121 in _multicall',
    ]
    recursion = [f'  File "{test_file}", line 2 in deep'] * 30
    text = "\n".join(
        [
            "---- [rank 0] pid 10 ----",
            "Current thread 0x00007f0e2ce4bb80 (most recent call first):",
            f'  File "{test_file}", line 1 in deep',
            *machinery,
            "---- [rank 1] pid 11 ----",
            "Current thread 0x00007f0e2ce4bb80 (most recent call first):",
            *recursion,
            *machinery,
        ]
    )

    shown = readable_stacks(text).splitlines()

    assert shown.count("  (2 frames of pytest, pluggy and devpool)") == 2, shown
    assert not [line for line in shown if "_pytest" in line or "_callers.py" in line]
    assert shown.count(f'  File "{test_file}", line 2 in deep') == 1
    assert "  [the frame above 29 more times]" in shown
    assert shown.index("---- [rank 1] pid 11 ----") > shown.index("---- [rank 0] pid 10 ----")
