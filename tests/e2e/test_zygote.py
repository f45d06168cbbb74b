"""Templates forked by the zygote (backends/zygote.py), a fork of the controller about to
collect, instead of fresh interpreters: the early ones and those the plan asks for later.
What a test sees in such a worker is what it sees in plain pytest: conftest and helper
assertions rewritten, no exit handler, file or lease of the controller's; and a controller
that is not safe to fork starts its templates afresh, with the same outcomes."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
from sessions import FAST, events

pytestmark = pytest.mark.usefixtures("_no_autoload")


@pytest.fixture
def _no_autoload(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


CONFTEST = """
import atexit
import json
import os
from pathlib import Path

import pytest

pytest.register_assert_rewrite("helpers")
OUT = Path({out!r})
REGISTERED_BY = os.getpid()
SEEN_DEVICES = os.environ.get("DEVPOOL_DEVICES")  # at import: a template's, not the controller's


def _at_exit():
    with open(OUT / "atexit.txt", "a") as log:
        log.write(f"{{REGISTERED_BY}} {{os.getpid()}}\\n")


atexit.register(_at_exit)
{extra}

@pytest.fixture
def checked():
    value = {{"a": 1, "b": 2}}
    assert value == {{"a": 1, "b": 3}}
"""

HELPERS = """
def same(left, right):
    assert left == right
"""

TESTS = """
import json
import os
from pathlib import Path

import pytest

from helpers import same

OUT = Path({out!r})


def view(pid):
    with open(f"/proc/{{pid}}/comm") as comm:
        name = comm.read().strip()
    with open(f"/proc/{{pid}}/stat") as stat:
        parent = int(stat.read().rsplit(")", 1)[1].split()[1])
    fds = []
    for fd in os.listdir(f"/proc/{{pid}}/fd"):
        try:
            fds.append(os.readlink(f"/proc/{{pid}}/fd/{{fd}}"))
        except OSError:
            pass
    with open(f"/proc/{{pid}}/cmdline", "rb") as cmdline:
        command = cmdline.read().replace(b"\\0", b" ").decode()
    return dict(pid=pid, name=name, parent=parent, fds=fds, command=command)


def ancestry(name):
    from tests.conftest import SEEN_DEVICES

    template = view(os.getppid())
    template["conftest_saw"] = SEEN_DEVICES
    (OUT / name).write_text(json.dumps([template, view(template["parent"])]))


def test_sees_its_template():
    ancestry("cpu.json")


def test_fixture_assertion(checked):
    pass


def test_helper_assertion():
    same([1, 2, 3], [1, 2, 4])


def test_own_assertion():
    x = 3
    assert x + 1 == 5


@pytest.mark.device_count(1)
def test_on_a_device():
    assert os.environ["DEVPOOL_DEVICES"]
    ancestry("device.json")
"""


def project(pytester: pytest.Pytester, out: Path, extra: str = "") -> None:
    # In a package, as most projects' tests are: pytest itself imports a top-level
    # `conftest` again in every session, but not `tests.conftest`; the conftest imports
    # the helper, so the controller has both before it forks.
    package = pytester.mkpydir("tests")
    (package / "conftest.py").write_text(
        CONFTEST.format(out=str(out), extra=extra) + "\nfrom helpers import same  # noqa\n"
    )
    pytester.makepyfile(helpers=HELPERS)
    (package / "test_mix.py").write_text(TESTS.format(out=str(out)))
    pytester.makeini("[pytest]\npythonpath = .\n")


def failures(output: str) -> dict[str, list[str]]:
    """Each failed test's `E` lines, as pytest printed them."""
    found: dict[str, list[str]] = {}
    current = None
    for line in output.splitlines():
        header = re.match(r"_{3,} (.+?) _{3,}$", line)
        if header:
            current = header.group(1)
            found[current] = []
        elif current and line.startswith("E "):
            found[current].append(line)
    return found


def test_a_template_forked_from_the_controller_keeps_nothing_of_it(
    pytester: pytest.Pytester, out: Path, lock: Path
) -> None:
    project(pytester, out)
    plain = pytester.runpytest_subprocess(*FAST, "-k", "not device", timeout=120)
    (out / "atexit.txt").unlink()
    result = pytester.runpytest_subprocess(
        *FAST, f"--devpool-lock-dir={lock}", "--devices", "sim:0-1", timeout=120
    )
    output = result.stdout.str()
    assert result.ret == 1, output
    assert "2 failed, 2 passed, 1 error" in output, output
    assert "fork server" not in output, output
    # Conftest, helper (register_assert_rewrite) and test assertions read as in plain pytest.
    expected = failures(plain.stdout.str())
    assert len(expected) == 3 and all(expected.values()), plain.stdout.str()
    assert failures(output) == expected, output

    [record] = pytester.path.glob(".devpool/runs/*/record.jsonl")
    [start] = events(record, "session_start")
    controller = start["pid"]
    # The CPU-only template started early; the 1-device one when the plan asked for it
    # (no history guessed it). Both children of the zygote, itself a child of the
    # controller: all three with the controller's command line (forks of it) and none of
    # its files: no lease, no lock folder, no record.
    for name, devices in (("cpu.json", ""), ("device.json", "0")):
        template, zygote = json.loads((out / name).read_text())
        # The conftest ran again in the template, in its environment, as in a fresh one.
        assert template["conftest_saw"] == devices, template
        assert template["name"] == "devpool-tmpl", template
        assert zygote["name"] == "devpool-zygote", zygote
        assert zygote["parent"] == controller, zygote
        for process in (template, zygote):
            assert "--devpool-worker" not in process["command"], process
            held = [p for p in process["fds"] if str(lock) in p or p.endswith(".jsonl")]
            assert not held, process["fds"]
    # The handler the controller's import of the conftest registered ran in the controller
    # alone (a template's own import registers one that its workers run, as afresh).
    lines = [line.split() for line in (out / "atexit.txt").read_text().splitlines()]
    assert [str(controller), str(controller)] in lines, lines
    assert all(ran == by for by, ran in lines if by == str(controller)), lines


def test_a_controller_that_runs_a_thread_starts_its_templates_afresh(
    pytester: pytest.Pytester, out: Path, lock: Path
) -> None:
    # A thread in the controller only (a fork of it would inherit its locks, not it).
    extra = textwrap.dedent(
        """
        import sys, threading, time
        if "--devpool-worker" not in sys.argv:
            threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
        """
    )
    project(pytester, out, extra)
    plain = pytester.runpytest_subprocess(*FAST, "-k", "not device", timeout=120)
    result = pytester.runpytest_subprocess(
        *FAST, f"--devpool-lock-dir={lock}", "--devices", "sim:0-1", timeout=120
    )
    output = result.stdout.str()
    assert "2 failed, 2 passed, 1 error" in output, output
    assert failures(output) == failures(plain.stdout.str()), output
    assert "fork server" not in output, output  # the templates themselves fork
    template, parent = json.loads((out / "cpu.json").read_text())
    assert template["name"] == "devpool-tmpl", template
    assert "--devpool-worker template," in template["command"], template  # afresh
    assert parent["name"] != "devpool-zygote", parent


UNSAFE_MODULE = """
import atexit
import os
import threading
import time
from pathlib import Path

import pytest

OUT = Path({out!r})
# A thread at import: the template that imports this module must not fork.
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()


def parent_name():
    with open(f"/proc/{{os.getppid()}}/comm") as comm:
        return comm.read().strip()


@pytest.mark.parametrize("i", range(3))
def test_in_a_worker_of_the_zygote(i):
    (OUT / f"parent-{{i}}").write_text(parent_name())
    atexit.register(lambda: (OUT / f"atexit-{{i}}-{{os.getpid()}}").write_text("ran"))
    assert i != 2, "the third fails"
"""


def test_an_unsafe_templates_workers_come_from_the_zygote_and_end_as_fresh_ones(
    pytester: pytest.Pytester, out: Path, lock: Path
) -> None:
    """A kind whose template may not fork (a thread started at import) gets its workers
    from the zygote: each collects for itself, without a start of its own, and ends as an
    interpreter ends (atexit handlers run), with plain pytest's outcomes."""
    pytester.makepyfile(test_unsafe=UNSAFE_MODULE.format(out=str(out)))
    plain = pytester.runpytest_subprocess(*FAST, timeout=120)
    for made in out.iterdir():
        made.unlink()
    result = pytester.runpytest_subprocess(
        *FAST,
        f"--devpool-lock-dir={lock}",
        "--devices",
        "sim:0-1",
        "--devpool-isolation=job",
        timeout=120,
    )
    output = result.stdout.str()
    assert "1 failed, 2 passed" in plain.stdout.str(), plain.stdout.str()
    assert "1 failed, 2 passed" in output, output
    assert failures(output) == failures(plain.stdout.str()), output
    assert "fork server for 0-device workers off" in output and "thread" in output, output
    parents = {(out / f"parent-{i}").read_text() for i in range(3)}
    assert parents == {"devpool-zygote"}, parents
    assert len(list(out.glob("atexit-*"))) == 3, sorted(p.name for p in out.iterdir())


WARNER = """
import warnings


def pytest_configure(config):
    # What pytest-asyncio does when its ini value is unset: a warning at configure time,
    # outside pytest's warning capture.
    warnings.warn(DeprecationWarning("set asyncio_default_fixture_loop_scope"))
"""

LOOKS_AROUND = """
import json
import logging
import os
import sys
from pathlib import Path

import pytest

OUT = Path({out!r})


@pytest.mark.parametrize("devices", [0, 1])
def test_looks_around(devices, request):
    if devices:
        request.applymarker(pytest.mark.device_count(1))
    root = logging.getLogger()
    seen = {{
        "handlers": sorted(type(h).__name__ for h in root.handlers),
        "level": root.level,
        "warning_filters": len([f for f in __import__("warnings").filters if f[0] == "error"]),
    }}
    name = os.environ.get("DEVPOOL_RUN_ID") and "devpool" or "plain"
    (OUT / f"{{name}}-{{devices}}.json").write_text(json.dumps(seen))
"""


def test_a_fork_of_the_zygote_sees_the_warning_filters_and_logging_of_a_fresh_process(
    pytester: pytest.Pytester, out: Path, lock: Path
) -> None:
    """The zygote is forked inside pytest's collection, where pytest applies the ini's
    filterwarnings and its log capture: a process forked from it starts as a fresh one
    (found by the click suite: pytest-asyncio's configure-time warning became an error)."""
    pytester.makepyfile(warner=WARNER, test_around=LOOKS_AROUND.format(out=str(out)))
    pytester.makeini("[pytest]\nfilterwarnings = error\nlog_level = DEBUG\n")
    plain = pytester.runpytest_subprocess(*FAST, "-p", "warner", timeout=120)
    assert plain.ret == 0, plain.stdout.str()
    result = pytester.runpytest_subprocess(
        *FAST, "-p", "warner", f"--devpool-lock-dir={lock}", "--devices", "sim:0-1", timeout=120
    )
    assert result.ret == 0, result.stdout.str()
    assert "2 passed" in result.stdout.str(), result.stdout.str()
    for devices in (0, 1):
        seen = json.loads((out / f"devpool-{devices}.json").read_text())
        assert seen == json.loads((out / f"plain-{devices}.json").read_text()), seen
