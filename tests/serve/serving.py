"""What the host page's tests share: the generated suite, real sessions on it, a `devpool
serve` subprocess and how to wait on a condition (imported by the test modules here)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

HOSTILE = "<img src=x onerror=alert(1)>"

# The generated suite: each test says it started (its devices held), then holds them until
# its session's release file appears, under a bound (never an unbounded sleep).
SUITE = """
import os
import time
from pathlib import Path

import pytest

FLAGS = Path(os.environ["SERVE_FLAGS"])
RELEASE = FLAGS / os.environ["SERVE_RELEASE"]


def hold(name):
    (FLAGS / (name + ".started")).write_text(os.environ.get("DEVPOOL_DEVICES", ""))
    deadline = time.monotonic() + 120
    while not RELEASE.exists():
        assert time.monotonic() < deadline, "never released"
        time.sleep(0.05)
"""

TESTS = {
    "test_hold.py": """
        @pytest.mark.device_count(2)
        @pytest.mark.parametrize("name", [{hostile!r}])
        def test_hostile(name):
            hold("hostile")


        @pytest.mark.device_count(1)
        def test_plain():
            hold("plain")
    """,
    "test_big.py": """
        @pytest.mark.device_count(4)
        def test_big():
            hold("big")
    """,
    "test_small.py": """
        @pytest.mark.device_count(2)
        def test_small():
            hold("small")
    """,
}


def need(module: str, why: str) -> None:
    """Skip without an optional module, except under CI=true, where [dev] must have it."""
    try:
        __import__(module)
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{module} is missing on CI; {why}")
        pytest.skip(f"{module} is not installed ({why})")


def wait_for(condition: Callable[[], Any], what: str, bound: float = 60.0) -> Any:
    """Poll a condition until it holds (returns its value) or the bound passes (fails)."""
    deadline = time.monotonic() + bound
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"waited {bound:g}s for {what}"
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Project:
    root: Path
    lock_dir: Path
    flags: Path

    @property
    def devpool(self) -> Path:
        return self.root / ".devpool"


class Session:
    """A real devpool pytest session on the generated suite, in its own process group."""

    def __init__(self, project: Project, name: str, *args: str) -> None:
        self.log = project.flags.parent / f"session-{name}.log"
        self.release_file = project.flags / f"release-{name}"
        env = dict(os.environ, SERVE_FLAGS=str(project.flags), SERVE_RELEASE=self.release_file.name)
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        env.pop("PYTEST_ADDOPTS", None)
        argv = [sys.executable, "-m", "pytest", "-p", "devpool.plugin", "-p", "no:cacheprovider"]
        argv += [f"--devpool-lock-dir={project.lock_dir}", "-q", *args]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                argv,
                cwd=project.root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def release(self) -> None:
        self.release_file.write_text("")

    def wait(self, bound: float = 120) -> int:
        try:
            return self.proc.wait(timeout=bound)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"session still running after {bound:g}s:\n{self.output()}"
            ) from None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    token: str | None = None

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        request = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def json(self, path: str) -> Any:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        status, body = self.get(path, headers)
        assert status == 200, (path, status, body[:300])
        return json.loads(body)


CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
