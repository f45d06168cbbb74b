"""Helpers the end-to-end tests share: a target project, a real session, what it printed.

Each e2e test writes a small target project whose tests record what they saw (`record`
in the generated PRELUDE), runs it in a real pytest session (pytester, a subprocess whose
workers are processes too) and reads what a user would: the exit status, the terminal,
the run record, JUnit. Imported by the test modules of this folder (pytest puts the
folder on sys.path when it imports them).
"""

from __future__ import annotations

import json
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

# Workers get the controller's arguments and environment: without plugin autoload (and
# hypothesis's plugin off) each worker start costs a fraction of a second.
FAST = ("-p", "devpool.plugin", "-p", "no:hypothesispytest", "-p", "no:cacheprovider")
# The same start, with pytest-randomly off: the target's tests start in the order written.
IN_ORDER = ("-p", "devpool.plugin", "-p", "no:cacheprovider", "-p", "no:randomly")

# Put at the top of every generated test module: lets a test record what it saw.
PRELUDE = """
import json
import os
import time
from pathlib import Path

import pytest

OUT = Path({out!r})


def record(key, **data):
    data.update(key=key, pid=os.getpid(), devices=os.environ.get("DEVPOOL_DEVICES"))
    tmp = OUT / (key + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, OUT / (key + ".json"))


def wait_until(condition, what, bound=30.0):
    deadline = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < deadline, "waited " + str(bound) + "s for " + what
        time.sleep(0.02)
"""


# For a once-fixture's conftest (a template's `{server}`): a server on a leased port that
# answers b"hello" to each connection; start_server(port) returns its process once it listens.
PORT_SERVER = """
def start_server(port):
    code = (
        "import socket\\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\\n"
        f"s.bind(('127.0.0.1', {port})); s.listen(64); print('up', flush=True)\\n"
        "while True:\\n"
        "    c, _ = s.accept(); c.sendall(b'hello'); c.close()\\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    proc.stdout.readline()
    return proc
"""


def suite(pytester: pytest.Pytester, out: Path, name: str, body: str) -> None:
    """A test module of the target project, with the PRELUDE on top."""
    pytester.makepyfile(**{name: PRELUDE.format(out=str(out)) + textwrap.dedent(body)})


def run(pytester: pytest.Pytester, lock: Path, *args: str, timeout: float = 60) -> pytest.RunResult:
    """A real devpool session on the target project, with a lock folder of its own."""
    return pytester.runpytest_subprocess(
        *FAST, f"--devpool-lock-dir={lock}", *args, timeout=timeout
    )


def text(result: pytest.RunResult) -> str:
    return result.stdout.str() + "\n" + result.stderr.str()


def closing_line(result: pytest.RunResult) -> str:
    lines = [line for line in result.outlines if line.strip()]
    return lines[-1] if lines else ""


def records(out: Path) -> dict[str, dict[str, Any]]:
    """What each target test recorded, by key."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(out.glob("*.json"))}


def events(path: Path, kind: str | None = None) -> list[dict[str, Any]]:
    """The run record's events (of one kind)."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in lines if kind is None or e["type"] == kind]


def job_ends(path: Path, test: str) -> list[dict[str, Any]]:
    ends = [e for e in events(path, "job_end") if e["test"].endswith(test)]
    return sorted(ends, key=lambda e: e["attempt"])


def junit_cases(xml: Path) -> list[ET.Element]:
    return list(ET.parse(xml).getroot().iter("testcase"))
