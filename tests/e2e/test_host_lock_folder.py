"""The default lock folder is one per host, whatever $TMPDIR says (issue 46, 1.5).

Two runner services on one host often have different TMPDIRs; with a lock folder under
$TMPDIR their runs held the same device at once. Here two real sessions, each with a TMPDIR
of its own and no lock folder named, want the same simulated device: the second waits in
the host's folder until the first lets go. The device id is one no other test uses, since
the folder is the host's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from devpool.devices.lockdir import default_lock_dir

DEVICE = "sim:61"  # the host's real lock folder: a device nobody else's tests ask for

SUITE = """
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.device_count(1)
def test_hold():
    (HERE / "started").write_text(str(time.time()))
    deadline = time.monotonic() + 90
    while not (HERE.parent / "release").exists():
        assert time.monotonic() < deadline, "never released"
        time.sleep(0.02)
    (HERE / "ended").write_text(str(time.time()))
"""


def _start(root: Path, tmpdir: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVPOOL_", "PYTEST_"))}
    env.update(TMPDIR=str(tmpdir), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "devpool.plugin", "-p", "no:cacheprovider"]
        + ["--devices", DEVICE, "test_hold.py"],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _wait_for(condition: Callable[[], bool], bound: float, what: str) -> None:
    deadline = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < deadline, f"waited {bound}s for {what}"
        time.sleep(0.05)


def _waits(folder: Path, pid: int) -> bool:
    for path in (folder / "waiting").glob("*.json"):
        try:
            if json.loads(path.read_text()).get("pid") == pid:
                return True
        except (OSError, ValueError):
            continue
    return False


def test_two_runs_with_different_tmpdirs_share_the_hosts_lock_folder(tmp_path: Path) -> None:
    runs = []
    for name in ("first", "second"):
        (tmp_path / name / "tmp").mkdir(parents=True)
        (tmp_path / name / "test_hold.py").write_text(SUITE, encoding="utf-8")
    folder = default_lock_dir()
    first = _start(tmp_path / "first", tmp_path / "first" / "tmp")
    runs.append(first)
    try:
        _wait_for(
            lambda: (tmp_path / "first" / "started").exists() or first.poll() is not None,
            60,
            "the first run's test to start",
        )
        assert first.poll() is None, first.communicate()[0]
        second = _start(tmp_path / "second", tmp_path / "second" / "tmp")
        runs.append(second)
        _wait_for(
            lambda: _waits(folder, second.pid) or second.poll() is not None,
            60,
            f"the second run to wait in {folder}",
        )
        assert second.poll() is None, second.communicate()[0]
        assert not (tmp_path / "second" / "started").exists()
        (tmp_path / "release").touch()
        outputs = [run.communicate(timeout=90)[0] for run in runs]
        assert [run.returncode for run in runs] == [0, 0], outputs
        first_ended = float((tmp_path / "first" / "ended").read_text())
        second_started = float((tmp_path / "second" / "started").read_text())
        assert second_started >= first_ended
        for output in outputs:  # the header names the folder both used
            assert str(folder) in output, output
    finally:
        (tmp_path / "release").touch()
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.communicate(timeout=30)
