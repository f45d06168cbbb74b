"""End to end: tests that declare device memory share a device, within its capacity.

Real sessions on sim devices with `memory = "10GiB"`: memory tests run side by side on
one device, never more than fits, never beside a whole-device test; a test that uses more
than it declared ends `failed` with the amounts; peaks land in the run record.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from sessions import IN_ORDER

HOLD = """
import json, os, time
from pathlib import Path
import pytest

SPANS = Path({spans!r})


def hold(kind, seconds=0.6, used=None):
    began = time.time()
    if used is not None:
        Path(os.environ["DEVPOOL_SIM_MEMORY_FILE"]).write_text(json.dumps(used))
    time.sleep(seconds)
    name = f"{{kind}}-{{os.getpid()}}-{{began}}"
    SPANS.joinpath(name).write_text(json.dumps(
        {{"kind": kind, "devices": os.environ["DEVPOOL_DEVICES"], "start": began,
          "end": time.time(), "declared": os.environ.get("DEVPOOL_DEVICE_MEMORY")}}
    ))
"""


@pytest.fixture(autouse=True)
def _fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)


def run(pytester: pytest.Pytester, body: str, *args: str) -> tuple[pytest.RunResult, Path, Path]:
    spans = pytester.path / "spans"
    spans.mkdir()
    pytester.makepyprojecttoml(
        """
        [tool.devpool.platforms]
        sim = { memory = "10GiB" }
        """
    )
    pytester.makepyfile(
        test_share=HOLD.format(spans=str(spans)) + textwrap.dedent(body),
    )
    record = pytester.path / "record.jsonl"
    lock = pytester.path / "locks"
    lock.mkdir()
    result = pytester.runpytest_subprocess(
        *IN_ORDER,
        f"--devpool-lock-dir={lock}",
        f"--devpool-run-record={record}",
        "--devpool-memory-reserve=0",
        *args,
        timeout=120,
    )
    return result, spans, record


def spans_of(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in folder.iterdir()]


def test_memory_tests_share_a_device_within_its_capacity(pytester: pytest.Pytester) -> None:
    result, spans, _ = run(
        pytester,
        """
        @pytest.mark.device_memory("4GiB")
        @pytest.mark.parametrize("n", range(6))
        def test_small(n):
            hold("small")

        @pytest.mark.device_exclusive
        def test_whole():
            hold("whole")
        """,
        "--devices",
        "sim:0",
        "--devpool-cpu-slots=4",
        "--devpool-max-parallel=4",
    )
    assert result.ret == 0, "\n".join(result.outlines)
    seen = spans_of(spans)
    assert len(seen) == 7
    small = [s for s in seen if s["kind"] == "small"]
    assert all(s["declared"] == str(4 * 2**30) for s in small), small
    # At every moment: at most two 4 GiB tests on the 10 GiB device, never beside the whole one.
    moments = sorted({s["start"] for s in seen} | {s["end"] - 1e-6 for s in seen})
    overlapped = False
    for t in moments:
        now = [s for s in seen if s["start"] <= t < s["end"]]
        kinds = [s["kind"] for s in now]
        assert kinds.count("small") * 4 <= 10, now
        assert "whole" not in kinds or len(kinds) == 1, now
        overlapped = overlapped or kinds.count("small") == 2
    assert overlapped, "memory tests never ran side by side"


def test_a_test_that_uses_more_than_it_declared_fails_saying_so(
    pytester: pytest.Pytester,
) -> None:
    result, _, record = run(
        pytester,
        """
        @pytest.mark.device_memory("2GiB")
        def test_greedy():
            hold("greedy", seconds=0.1, used=3 * 2**30)

        @pytest.mark.device_memory("2GiB")
        def test_modest():
            hold("modest", seconds=0.1, used=2**30)
        """,
        "--devices",
        "sim:0",
        "--junitxml=junit.xml",
    )
    text = "\n".join(result.outlines)
    assert result.ret == 1, text
    assert "used 3 GiB on sim:0, declared 2 GiB" in text, text
    junit = (pytester.path / "junit.xml").read_text()
    assert f'name="devpool.memory_peak" value="0:{2**30}"' in junit, junit
    ends = {
        json.loads(line)["nodeid"].split("::")[-1]: json.loads(line)
        for line in record.read_text().splitlines()
        if json.loads(line)["type"] == "job_end"
    }
    assert ends["test_greedy"]["outcome"] == "failed"
    assert ends["test_modest"]["outcome"] == "passed"
    assert ends["test_modest"]["memory_peak"] == {"0": 2**30}


def test_a_request_larger_than_the_device_is_unsatisfiable(pytester: pytest.Pytester) -> None:
    result, _, _ = run(
        pytester,
        """
        @pytest.mark.device_memory("11GiB")
        def test_too_big():
            pass
        """,
        "--devices",
        "sim:0",
    )
    text = "\n".join(result.outlines)
    assert result.ret == 1, text
    assert "needs 1 device × 11 GiB" in text, text


def test_out_of_memory_beside_others_runs_again_alone_and_is_not_blamed(
    pytester: pytest.Pytester,
) -> None:
    result, spans, record = run(
        pytester,
        """
        @pytest.mark.device_memory("4GiB")
        def test_victim():
            if os.environ.get("DEVPOOL_DEVICE_MEMORY"):  # shared: a neighbour took the rest
                hold("victim-shared", seconds=0.1, used=2**30)
                raise RuntimeError("DEVPOOL-SIM-OOM: out of memory on the device")
            hold("victim-alone", seconds=0.1)
        """,
        "--devices",
        "sim:0",
    )
    text = "\n".join(result.outlines)
    assert result.ret == 0, text
    assert "ran out of memory beside other tests" in text and "retried alone" in text, text
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    finals = [e for e in lines if e["type"] == "job_end" and not e["retried"]]
    assert [e["outcome"] for e in finals] == ["passed"], finals  # not flaky, not blamed
    assert [e["type"] for e in lines].count("memory_retry") == 1
    assert sorted(s["kind"] for s in spans_of(spans)) == ["victim-alone", "victim-shared"]


def test_concurrent_sessions_share_capacity_and_a_killed_holder_frees_its_share(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    spans = tmp_path / "spans"
    spans.mkdir()
    lock = tmp_path / "locks"
    lock.mkdir()
    pytester.makepyprojecttoml(
        """
        [tool.devpool.platforms]
        sim = { memory = "10GiB" }
        """
    )
    mixed = """
        @pytest.mark.device_memory("4GiB")
        @pytest.mark.parametrize("n", range(4))
        def test_small(n):
            hold("small")

        @pytest.mark.device_memory("6GiB")
        def test_medium():
            hold("medium")

        @pytest.mark.device_exclusive
        def test_whole():
            hold("whole")
        """
    killed = """
        @pytest.mark.device_memory("8GiB")
        def test_holds_and_is_killed():
            Path(os.environ["KILL_ME"]).write_text(os.environ["DEVPOOL_DEVICES"])
            time.sleep(600)
        """
    for name, body in (("first", mixed), ("second", mixed), ("killed", killed)):
        folder = pytester.path / name
        folder.mkdir()
        (folder / f"test_{name}.py").write_text(
            HOLD.format(spans=str(spans)) + textwrap.dedent(body)
        )
    env = dict(os.environ, KILL_ME=str(tmp_path / "holding"))

    def start(name: str) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "pytest", *IN_ORDER, "--devices", "sim:0-1", name]
        argv += [f"--devpool-lock-dir={lock}", "--devpool-memory-reserve=0", "-q"]
        return subprocess.Popen(argv, cwd=pytester.path, env=env, start_new_session=True)

    victim = start("killed")
    bound = time.monotonic() + 60
    while not (tmp_path / "holding").exists() and time.monotonic() < bound:
        time.sleep(0.05)
    assert (tmp_path / "holding").exists()
    held_on = (tmp_path / "holding").read_text()
    runs = [start("first"), start("second")]
    time.sleep(0.5)  # both sessions are placing beside the 8 GiB share now
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    assert [run.wait(timeout=120) for run in runs] == [0, 0]

    seen = spans_of(spans)
    assert len(seen) == 12
    sizes = {"small": 4, "medium": 6, "whole": 10}
    for device in ("0", "1"):
        on = [s for s in seen if s["devices"] == device]
        for t in sorted({s["start"] for s in on}):
            now = [s for s in on if s["start"] <= t < s["end"]]
            assert sum(sizes[s["kind"]] for s in now) <= 10, (device, now)
            assert "whole" not in [s["kind"] for s in now] or len(now) == 1, now
    # The killed holder's 8 GiB came back: a 6 GiB test ran on its device afterwards.
    assert any(s["kind"] in ("medium", "whole") and s["devices"] == held_on for s in seen)
