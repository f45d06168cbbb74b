"""How a ranks test that crashes or times out in its body reads: as a failure of its body
(pytest's FAILURES entry of the test, not `ERROR at setup of`), its rerun said on the page
and in its report, every rank's stacks folded alike, no stray word of a worker's pytest
progress in the ranks' output blocks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sessions import run, text

CRASH = """
import os
import pytest

@pytest.mark.ranks(2)
def test_crash():
    if os.environ["RANK"] == "1":
        os._exit(3)
"""

HANG = """
import os
import time
import pytest

def deep(n):
    if n == 0:
        time.sleep(60)
    deep(n - 1)

@pytest.mark.ranks(2)
@pytest.mark.timeout(2)
def test_hang():
    if os.environ["RANK"] == "1":
        deep(30)
    time.sleep(60)
"""


@pytest.fixture(autouse=True)
def _only_named_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)


def no_progress_in_rank_blocks(out: str) -> None:
    """A `[rank N] output during this test (tail)` block holds the test's output only."""
    for block in re.split(r"---- \[rank \d\] output during this test \(tail\) ----\n", out)[1:]:
        first = block.split("\n---- ", 1)[0].splitlines()
        assert not [line for line in first if re.fullmatch(r"(\S+\.py ?)?[.FE]* *", line)], block


def test_a_ranks_crash_in_its_body_is_a_failure_of_the_body_and_its_rerun_is_said(
    pytester: pytest.Pytester, lock: Path
) -> None:
    pytester.makepyfile(test_crash=CRASH)

    result = run(pytester, lock, "--devices=sim:0-1", "--devpool-reruns-infra=1", "-rA")

    out = text(result)
    assert result.ret == 1, out
    assert "ERROR at setup of test_crash" not in out
    assert re.search(r"^_+ test_crash _+$", out, re.M), out
    assert "devpool: test_crash.py::test_crash crashed; it runs again: attempt 2" in out
    assert "(--devpool-reruns-infra 1)" in out
    assert "attempt 2, after 1 that did not pass (--devpool-reruns-infra 1)" in out
    logs = sorted(pytester.path.glob(".devpool/runs/*/logs/test_crash.py_test_crash*.log"))
    assert len(logs) == 2
    said = "\n".join(log.read_text() for log in logs)
    assert "it runs again: attempt 2" in said and "attempt 2, after 1" in said
    no_progress_in_rank_blocks(out)


def test_a_ranks_timeout_folds_every_ranks_stacks_alike(
    pytester: pytest.Pytester, lock: Path
) -> None:
    pytester.makepyfile(test_hang=HANG)

    result = run(pytester, lock, "--devices=sim:0-1", "--devpool-timeout-grace=1", timeout=120)

    out = text(result)
    assert "1 timeout" in out, out
    assert "ERROR at setup of test_hang" not in out
    stacks = out.split("---- stacks at the timeout (faulthandler) ----", 1)[1]
    stacks = stacks.split("=====", 1)[0]
    assert "---- [rank 0]" in stacks and "---- [rank 1]" in stacks
    for rank in stacks.split("---- [rank ")[1:]:
        assert "frames of pytest, pluggy and devpool)" in rank, rank
        assert "_pytest" not in rank and "pluggy" not in rank.replace("pytest, pluggy", ""), rank
    assert "[the frame above 29 more times]" in stacks
    no_progress_in_rank_blocks(out)
