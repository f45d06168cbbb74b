"""A shared host is hostile ground: what another Unix user plants in the lock folder never
hangs or crashes a run, and never lets two runs hold one device.

The other user is made here (useradd, as root); without root the tests say why they skip.
Every subprocess is bounded by a timeout: a hang fails the test, it never hangs CI.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None or shutil.which("runuser") is None,
    reason="needs root (to make a second Unix user with useradd, and act as it with runuser)",
)

MALLORY = "devpool-mallory"
SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture(scope="module")
def mallory() -> str:
    if subprocess.run(["id", MALLORY], capture_output=True, check=False).returncode != 0:
        subprocess.run(
            ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", MALLORY],
            check=True,
            capture_output=True,
            timeout=30,
        )
    return MALLORY


@pytest.fixture
def lock() -> Iterator[Path]:
    """A lock folder made by root, mode 1777, in a place every user can reach."""
    parent = Path(tempfile.mkdtemp(prefix="devpool-hostile-", dir="/tmp"))
    os.chmod(parent, 0o755)
    folder = parent / "locks"
    folder.mkdir()
    os.chmod(folder, 0o1777)
    yield folder
    shutil.rmtree(parent, ignore_errors=True)


def as_user(user: str, *argv: str) -> None:
    subprocess.run(["runuser", "-u", user, "--", *argv], check=True, timeout=30)


def pytest_run(
    project: Path, lock: Path, *args: str, timeout: float = 120
) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVPOOL_")}
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "devpool.plugin", "-p", "no:cacheprovider"]
        + [f"--devpool-lock-dir={lock}", *args],
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


SUITE = """
import pytest

@pytest.mark.device_count(1)
@pytest.mark.parametrize("i", range(4))
def test_one(i):
    pass
"""


def test_planted_entries_leave_the_victim_green_with_one_sentence_each(
    mallory: str, lock: Path, tmp_path: Path
) -> None:
    as_user(mallory, "ln", "-s", "/etc/passwd", str(lock / "sim-1.lock"))
    as_user(mallory, "mkdir", str(lock / "sim-2.lock"))
    as_user(mallory, "mkfifo", str(lock / "sim-3.lock"))
    as_user(mallory, "sh", "-c", f"umask 077; : > {lock / 'sim-4.lock'}")
    as_user(mallory, "sh", "-c", f"echo x > {lock / 'waiting'}")
    (tmp_path / "test_it.py").write_text(SUITE)
    run = pytest_run(tmp_path, lock, "--devices", "sim:0-4", "-p", "no:randomly")
    out = run.communicate(timeout=120)[0]
    assert run.returncode == 0, out
    assert "4 passed" in out and "INTERNALERROR" not in out and "Traceback" not in out, out
    for device in (1, 2, 3):
        lines = [line for line in out.splitlines() if f"sim:{device} retired" in line]
        assert len(lines) == 1 and f"sim-{device}.lock" in lines[0], out


HOLDER = """
import os
import time
from pathlib import Path

import pytest

@pytest.mark.device_count(1)
def test_hold(devpool_devices):
    folder = Path(os.environ["WHERE"])
    (folder / f"{os.environ['NAME']}.start").write_text(str(time.time()))
    deadline = time.monotonic() + 60
    while not (folder / "go").exists() and os.environ["NAME"] == "first":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    (folder / f"{os.environ['NAME']}.end").write_text(str(time.time()))
"""


def test_a_removed_lock_file_never_gives_two_holders(
    mallory: str, lock: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mallory owns sim-0.lock, so the sticky folder lets her remove it while a run holds
    it; the next run makes a new one, and must still see that the device is held."""
    as_user(mallory, "sh", "-c", f"umask 0; : > {lock / 'sim-0.lock'}")
    (tmp_path / "test_hold.py").write_text(HOLDER)
    monkeypatch.setenv("WHERE", str(tmp_path))
    monkeypatch.setenv("NAME", "first")
    first = pytest_run(tmp_path, lock, "--devices", "sim:0")
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "first.start").exists():
            assert first.poll() is None, first.communicate()[0]
            assert time.monotonic() < deadline, "the first run never started its test"
            time.sleep(0.02)
        as_user(mallory, "rm", "-f", str(lock / "sim-0.lock"))
        monkeypatch.setenv("NAME", "second")
        second = pytest_run(tmp_path, lock, "--devices", "sim:0")
        deadline = time.monotonic() + 60
        # The second run waits: it says so in the waiting room, and its test has not begun.
        while not list((lock / "waiting").glob("*.json")):
            assert second.poll() is None, second.communicate()[0]
            assert time.monotonic() < deadline, "the second run never waited"
            time.sleep(0.02)
        assert not (tmp_path / "second.start").exists()
    finally:
        (tmp_path / "go").write_text("")
    out = first.communicate(timeout=120)[0]
    assert first.returncode == 0, out
    out = second.communicate(timeout=120)[0]
    assert second.returncode == 0, out
    first_end = float((tmp_path / "first.end").read_text())
    assert float((tmp_path / "second.start").read_text()) >= first_end
