"""End to end: peaks a real run watched land in the history, and `devpool capacity
--suggest-memory` proposes a declaration from them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from sessions import IN_ORDER

from devpool.history.durations import History, default_history_path

GiB = 2**30


@pytest.fixture(autouse=True)
def _fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)


def test_watched_peaks_reach_the_history_and_a_suggestion(pytester: pytest.Pytester) -> None:
    pytester.makepyprojecttoml(
        """
        [tool.devpool.platforms]
        sim = { memory = "10GiB" }
        """
    )
    pytester.makepyfile(
        test_peaks="""
        import json, os
        from pathlib import Path
        import pytest

        def use(amount):
            Path(os.environ["DEVPOOL_SIM_MEMORY_FILE"]).write_text(json.dumps(amount))

        @pytest.mark.device_memory("4GiB")
        def test_modest():
            use(3 * 2**30)

        @pytest.mark.device_count(2)
        @pytest.mark.device_memory("2GiB")
        def test_pair():
            use({"0": 2**29, "1": 2**30})  # the history keeps the larger

        @pytest.mark.device_count(1)
        def test_whole(devpool_devices):
            assert devpool_devices
        """
    )
    lock = pytester.path / "locks"
    lock.mkdir()
    result = pytester.runpytest_subprocess(
        *IN_ORDER, f"--devpool-lock-dir={lock}", "--devices", "sim:0-1", timeout=120
    )
    assert result.ret == 0, "\n".join(result.outlines)
    with History(default_history_path(pytester.path)) as history:
        peaks = {r.nodeid.split("::")[-1]: r.memory_peak for r in history.results()}
    assert peaks == {"test_modest": 3 * GiB, "test_pair": GiB, "test_whole": None}

    environ = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "DEVPOOL_"))}
    command = [sys.executable, "-m", "devpool.cli", "capacity", "--suggest-memory"]
    command += ["--platform", "sim"]
    collect = ["--", "test_peaks.py", *IN_ORDER[2:]]
    done = subprocess.run(
        [*command, "--format", "json", *collect],
        cwd=pytester.path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    suggested = {s["nodeid"].split("::")[-1]: s["suggested"] for s in data["suggestions"]}
    assert suggested == {"test_modest": "3.75GiB", "test_pair": "1.25GiB"}
    assert data["without_peak"] == 1  # test_whole holds a whole device: never watched

    text = subprocess.run(
        [*command, *collect],
        cwd=pytester.path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert text.returncode == 0, text.stderr
    assert '@pytest.mark.device_memory("3.75GiB")' in text.stdout
    assert "1 device test has no recorded peak" in text.stdout
