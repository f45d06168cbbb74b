"""End to end: isolated processes fork from a template that has collected (the fork server).

Real pytest sessions on simulated devices. Each target test records its pid, its parent's
command line and how often its module was imported in this process tree; a template is
the process whose command line says `--devpool-worker template,...`.
"""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest
from sessions import closing_line, events, records, run, suite, text

from openmp_library import build_openmp_library

pytestmark = pytest.mark.usefixtures("_no_autoload")

# Appended to every generated module: which process imported it, and who its parent is.
WHO = """
IMPORTS = OUT / "imports.txt"
with open(IMPORTS, "a") as log:
    log.write(f"{{__name__}} {{os.getpid()}}\\n")


def parent():
    # A template names itself (it may be a fork of the controller, with its command line).
    with open(f"/proc/{{os.getppid()}}/comm") as comm:
        return comm.read().strip()


def seen(name, **data):
    record(name, ppid=os.getppid(), parent=parent(), **data)
"""


@pytest.fixture
def _no_autoload(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


def module(pytester: pytest.Pytester, out: Path, name: str, body: str) -> None:
    suite(pytester, out, name, WHO.format() + textwrap.dedent(body))


def imports(out: Path) -> list[tuple[str, int]]:
    lines = (out / "imports.txt").read_text().split()
    return list(zip(lines[::2], map(int, lines[1::2]), strict=True))


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def gone(pids: set[int], bound: float = 10.0) -> bool:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if not any(alive(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False


CASES = """
STATE = []


@pytest.mark.parametrize("i", range(4))
def test_cpu(i):
    STATE.append(i)
    seen(f"cpu{i}", state=list(STATE))
    print(f"output of cpu{i}")
    assert i != 3, "cpu3 fails on purpose"


@pytest.mark.device_count(1)
@pytest.mark.parametrize("i", range(3))
def test_device(i, devpool_devices):
    STATE.append(i)
    seen(f"dev{i}", state=list(STATE), mine=list(devpool_devices))
"""


def test_isolation_job_forks_each_test_from_a_template_that_imported_the_module_once(
    pytester: pytest.Pytester, out: Path, lock: Path
) -> None:
    module(pytester, out, "test_cases.py", CASES)
    result = run(pytester, lock, "--devices", "sim:0-1", "--devpool-isolation", "job")
    output = text(result)
    assert result.ret == 1, output
    assert "1 failed, 6 passed" in closing_line(result), output
    assert "fork server" not in output, output  # nothing kept it from forking
    seen = records(out)
    assert len(seen) == 7, seen
    # A process of its own for every test: no state of another test in it.
    assert all(r["state"] == [int(r["key"][-1])] for r in seen.values()), seen
    assert len({r["pid"] for r in seen.values()}) == 7, seen
    # Each forked from a template (one per kind: CPU-only, one device), not started afresh.
    assert all(r["parent"] == "devpool-tmpl" for r in seen.values()), seen
    templates = {r["ppid"] for r in seen.values()}
    assert len(templates) == 2, seen
    # The module was imported by the controller and once by each template, never per test.
    importers = {pid for _, pid in imports(out)}
    assert len(importers) == 3 and templates < importers, imports(out)
    # Each test sees its own devices, and its own output is reported with it alone.
    for key in ("dev0", "dev1", "dev2"):
        assert seen[key]["devices"] == ",".join(map(str, seen[key]["mine"])), seen[key]
    assert "output of cpu3" in output and "output of cpu1" not in output, output
    assert gone(templates), "a template outlived its run"


def test_without_the_fork_server_every_test_starts_a_fresh_interpreter_with_the_same_outcomes(
    pytester: pytest.Pytester, out: Path, lock: Path
) -> None:
    module(pytester, out, "test_cases.py", CASES)
    result = run(
        pytester,
        lock,
        "--devices",
        "sim:0-1",
        "--devpool-isolation",
        "job",
        "--devpool-no-fork-server",
    )
    assert "1 failed, 6 passed" in closing_line(result), text(result)
    seen = records(out)
    assert not any(r["parent"] == "devpool-tmpl" for r in seen.values()), seen
    assert len({pid for _, pid in imports(out)}) == 1 + 7, imports(out)  # controller + each test


def test_the_isolate_marker_and_a_retry_after_a_crash_fork_too(
    pytester: pytest.Pytester, out: Path, lock: Path
) -> None:
    module(
        pytester,
        out,
        "test_mixed.py",
        """
        import signal

        def test_warm_one():
            seen("warm1")

        def test_warm_two():
            seen("warm2")

        @pytest.mark.isolate
        def test_isolated():
            seen("isolated")

        @pytest.mark.isolate
        def test_crashes_once():
            first = not (OUT / "crashed-once").exists()
            seen("crash" + ("1" if first else "2"))
            if first:
                (OUT / "crashed-once").write_text("")
                print("last words before the crash", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
        """,
    )
    result = run(pytester, lock, "--devices", "sim:0", "--devpool-cpu-slots=1", "-p", "no:randomly")
    output = text(result)
    seen = records(out)
    assert "flaky" in closing_line(result) and "3 passed" in closing_line(result), output
    # What the crashed child wrote is in its attempt's log: its own capture files, not
    # the template's (shared by every child, they would mix tests' output).
    [log] = pytester.path.glob(".devpool/runs/*/logs/test_mixed.py_test_crashes_once.log")
    assert "last words before the crash" in log.read_text(), log.read_text()
    for key in ("isolated", "crash1", "crash2"):  # the retry too: a fork, not a fresh start
        assert seen[key]["parent"] == "devpool-tmpl", seen
    # Warm CPU-only workers fork too (from the template that collected while the controller
    # did), and still run many tests each: both warm tests in one process, no other's.
    assert seen["warm1"]["parent"] == "devpool-tmpl", seen
    assert seen["warm1"]["pid"] == seen["warm2"]["pid"], seen
    assert seen["warm1"]["pid"] not in {seen[k]["pid"] for k in ("isolated", "crash1", "crash2")}


def test_a_thread_in_the_template_means_fresh_interpreters_and_one_line_saying_why(
    pytester: pytest.Pytester, out: Path, lock: Path
) -> None:
    pytester.makeconftest(
        """
        import threading, time

        threading.Thread(target=time.sleep, args=(600,), name="telemetry", daemon=True).start()
        """
    )
    module(
        pytester,
        out,
        "test_two.py",
        """
        @pytest.mark.parametrize("i", range(2))
        def test_it(i):
            seen(f"t{i}")
        """,
    )
    result = run(pytester, lock, "--devices", "sim:0", "--devpool-isolation", "job")
    output = text(result)
    assert "2 passed" in closing_line(result), output
    why = "fork server for 0-device workers off: not safe to fork: it runs 1 thread(s)"
    assert output.count(why) == 1 and "telemetry" in output, output
    assert not any(r["parent"] == "devpool-tmpl" for r in records(out).values())
    [event] = events(next(pytester.path.glob(".devpool/runs/*/record.jsonl")), "fork_server")
    assert "telemetry" in str(event["note"]), event


def test_a_module_that_initialises_a_device_runtime_at_import_is_named(
    pytester: pytest.Pytester, out: Path, lock: Path
) -> None:
    # A runtime of the project's own, told to devpool through its hook.
    pytester.makepyfile(
        simrt="initialised = False\n\ndef init():\n    global initialised\n    initialised = True\n"
    )
    pytester.makeconftest(
        """
        import simrt

        def pytest_devpool_device_initialised(config):
            return "simrt" if simrt.initialised else None
        """
    )
    module(pytester, out, "test_clean.py", "def test_clean():\n    seen('clean')\n")
    module(
        pytester,
        out,
        "test_eager.py",
        "import simrt\nsimrt.init()\n\ndef test_eager():\n    seen('eager')\n",
    )
    result = run(pytester, lock, "--devices", "sim:0", "--devpool-isolation", "job")
    output = text(result)
    assert "2 passed" in closing_line(result), output
    assert "importing test_eager.py initialised simrt" in output, output
    assert not any(r["parent"] == "devpool-tmpl" for r in records(out).values())


def test_a_template_killed_under_its_children_ends_their_tests_and_the_run_goes_on(
    pytester: pytest.Pytester, out: Path, lock: Path
) -> None:
    module(
        pytester,
        out,
        "test_kill.py",
        """
        import signal

        def test_kills_its_template():
            first = not (OUT / "killed").exists()
            seen("killer" + ("1" if first else "2"))
            if first:
                (OUT / "killed").write_text("")
                os.kill(os.getppid(), signal.SIGKILL)  # the template; PDEATHSIG ends us
                time.sleep(30)

        @pytest.mark.parametrize("i", range(3))
        def test_after(i):
            seen(f"after{i}")
        """,
    )
    result = run(
        pytester,
        lock,
        "--devices",
        "sim:0",
        "--devpool-isolation",
        "job",
        "--devpool-cpu-slots=1",
        "-p",
        "no:randomly",
    )
    output = text(result)
    seen = records(out)
    assert seen["killer1"]["parent"] == "devpool-tmpl", seen
    assert "fork server for 0-device workers off: the template" in output, output
    assert "3 passed" in closing_line(result) and "1 flaky" in closing_line(result), output
    assert seen["killer2"]["parent"] != "devpool-tmpl", seen  # fresh, the template is gone
    pids = {int(r["pid"]) for r in seen.values()}
    assert gone(pids), "a forked worker outlived its run"


def test_a_timeout_in_a_forked_worker_dumps_its_stacks_and_ends_that_test(
    pytester: pytest.Pytester, out: Path, lock: Path
) -> None:
    module(
        pytester,
        out,
        "test_slow.py",
        """
        def _stuck_here():
            time.sleep(60)

        @pytest.mark.timeout(1)
        def test_hangs():
            seen("hangs")
            _stuck_here()

        def test_fine():
            seen("fine")
        """,
    )
    started = time.monotonic()
    result = run(
        pytester,
        lock,
        "--devices",
        "sim:0",
        "--devpool-isolation",
        "job",
        "--devpool-timeout-grace=1",
    )
    output = text(result)
    assert time.monotonic() - started < 30, output
    assert "1 timeout" in closing_line(result) and "1 passed" in closing_line(result), output
    assert "in _stuck_here" in output, output  # the forked child's faulthandler, its own file
    assert records(out)["hangs"]["parent"] == "devpool-tmpl"
    assert gone({int(records(out)["hangs"]["pid"])})


@pytest.mark.timeout(180)
def test_an_openmp_pool_started_at_import_leaves_its_module_out_of_the_template(
    pytester: pytest.Pytester,
    out: Path,
    lock: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A module that runs a parallel op at import starts libgomp's threads in the template;
    `threading` cannot see them, and every child forked from it would hang on its first
    parallel op. The template says so, naming the module and libgomp: the module's tests
    start in processes of their own, and a new template without it forks the kind's other
    tests. Every test passes."""
    library = build_openmp_library(tmp_path)
    # A pool of two threads, as the user's own OMP_NUM_THREADS (kept) or a thread budget
    # above one gives: with one thread, libgomp starts none and the template may fork.
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    module(
        pytester,
        out,
        "test_golden.py",
        f"""
        import ctypes

        LIB = ctypes.CDLL({str(library)!r})
        LIB.parallel_sum.restype = ctypes.c_double
        GOLDEN = LIB.parallel_sum(200000)  # a parallel op at import, as torch.softmax is


        @pytest.mark.device_count(1)
        @pytest.mark.parametrize("i", range(2))
        def test_parallel(i):
            assert LIB.parallel_sum(200000) == GOLDEN
            seen(f"t{{i}}")
        """,
    )
    module(
        pytester,
        out,
        "test_plain.py",
        """
        @pytest.mark.device_count(1)
        @pytest.mark.parametrize("i", range(3))
        def test_quiet(i):
            seen(f"q{i}")
        """,
    )
    # A process per module: in worker isolation a worker that collected both may run both.
    isolation = "--devpool-isolation=module"
    result = run(pytester, lock, "--devices", "sim:0-1", isolation, timeout=120)
    output = text(result)
    assert "5 passed" in closing_line(result), output
    said = "fork server for 1-device workers: importing test_golden.py made their template"
    assert said in output and "not safe to fork" in output, output
    assert "libgomp" in output and "native thread" in output, output
    seen_by = records(out)
    assert not any(seen_by[f"t{i}"]["parent"] == "devpool-tmpl" for i in range(2)), seen_by
    assert all(seen_by[f"q{i}"]["parent"] == "devpool-tmpl" for i in range(3)), seen_by
