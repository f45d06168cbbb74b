"""Fixtures of the host page's tests: a `devpool serve` subprocess on a free loopback port,
real devpool sessions on a generated suite, and headless Chromium through Playwright."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from serving import (
    CHROMIUM_ARGS,
    HOSTILE,
    SUITE,
    TESTS,
    Project,
    Server,
    Session,
    free_port,
    need,
    wait_for,
)


@pytest.fixture
def project(tmp_path: Path) -> Project:
    """A target project with the generated suite, a lock folder and a flags folder."""
    root = tmp_path / "proj"
    root.mkdir()
    (root / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\naddopts = []\n\n[tool.devpool.quarantine."test_hold.py::'
        'test_plain"]\nreason = "flaky on sim"\nowner = "infra"\nuntil = "2099-01-01"\n'
    )
    for name, body in TESTS.items():
        (root / name).write_text(SUITE + textwrap.dedent(body.format(hostile=HOSTILE)))
    (tmp_path / "locks").mkdir()
    (tmp_path / "flags").mkdir()
    return Project(root, tmp_path / "locks", tmp_path / "flags")


@pytest.fixture
def sessions(project: Project) -> Iterator[Callable[..., Session]]:
    """Start sessions; any still running at the end is released, then killed by its pgid."""
    started: list[Session] = []

    def start(name: str, *args: str) -> Session:
        session = Session(project, name, *args)
        started.append(session)
        return session

    yield start
    for session in started:
        session.release()
    for session in started:
        with contextlib.suppress(subprocess.TimeoutExpired):
            session.proc.wait(timeout=20)
        session.kill()


@pytest.fixture
def serve(project: Project, tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """Start `devpool serve` on a free loopback port over the project; stopped by its pid."""
    for module in ("starlette", "uvicorn"):
        need(module, "pip install -e '.[serve]' (pinned in [dev] too)")
    started: list[Server] = []

    def start(*extra: str, token: str | None = None) -> Server:
        port = free_port()
        log = tmp_path / f"serve-{len(started)}.log"
        argv = [sys.executable, "-m", "devpool.cli", "serve", "--port", str(port)]
        argv += [f"--lock-dir={project.lock_dir}", *extra, str(project.devpool)]
        if token:  # from a file: a token in argv is refused (ps shows it to every user)
            token_file = tmp_path / f"token-{len(started)}"
            token_file.write_text(token + "\n")
            argv += [f"--token-file={token_file}"]
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, cwd=project.root, stdout=out, stderr=subprocess.STDOUT)
        server = Server(f"http://127.0.0.1:{port}", proc, log, token)
        started.append(server)

        def answers() -> bool:
            assert proc.poll() is None, log.read_text(errors="replace")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                return False
            return True

        wait_for(answers, "devpool serve to listen", 30)
        return server

    yield start
    hung = []
    for server in started:
        server.proc.terminate()  # pages may still hold /events open: it must stop anyway
        try:
            server.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()
            hung.append(server.url)
    assert not hung, f"devpool serve did not stop on SIGTERM within 10 s: {hung}"


@pytest.fixture
def browser() -> Iterator[Any]:
    """Headless system Chromium through Playwright; skipped only off CI when it is missing
    (as tests/report/test_html_report.py does)."""
    chromium = shutil.which("chromium")
    if chromium is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is missing on CI; .ci/run installs it")
        pytest.skip("chromium is not installed")
    need("playwright", "it is pinned in [dev]")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()
