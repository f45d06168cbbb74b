"""End to end: what devpool collects, plans and hands to workers (issue 13, parts 2-4 and 6).

Each test writes a small project, runs real pytest sessions in subprocesses on simulated
devices and checks what ran, where, and what the terminal and the logs say.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from devpool.devices.inventory import detect

FAST = ("-p", "no:hypothesispytest", "-p", "no:randomly")

# Each test that runs leaves ran/<test name> holding the devices it saw.
RAN_CONFTEST = """
import os
import pathlib

import pytest


@pytest.fixture(autouse=True)
def _record_run(request):
    ran = pathlib.Path(str(request.config.rootpath)) / "ran"
    ran.mkdir(exist_ok=True)
    (ran / request.node.name).write_text(os.environ.get("DEVPOOL_DEVICES", "in-process"))
"""


def run(pytester: pytest.Pytester, tmp_path: Path, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        *FAST, f"--devpool-lock-dir={tmp_path / 'locks'}", *args, timeout=60
    )


def ran(pytester: pytest.Pytester) -> dict[str, str]:
    """Test name → the DEVPOOL_DEVICES it saw."""
    folder = pytester.path / "ran"
    if not folder.is_dir():
        return {}
    return {p.name: p.read_text() for p in sorted(folder.iterdir())}


def output(result: pytest.RunResult) -> str:
    return result.stdout.str() + "\n" + result.stderr.str()


# ---- requests are read after every pytest_collection_modifyitems ---------------------------


def test_a_marker_a_conftest_adds_in_modifyitems_gets_its_devices(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makeconftest(
        RAN_CONFTEST
        + """

def pytest_collection_modifyitems(items):
    for item in items:
        if item.name == "test_two_cards":
            item.add_marker(pytest.mark.device_count(2))
        if item.name == "test_cuda_only":
            item.add_marker(pytest.mark.platforms(["cuda"]))
"""
    )
    pytester.makepyfile(
        test_late="""
        def test_two_cards():
            pass

        def test_cpu():
            pass

        def test_cuda_only():
            pass
        """
    )
    result = run(pytester, tmp_path, "--devices", "sim:0-3")

    assert result.ret == 0, output(result)
    result.assert_outcomes(passed=2, deselected=1)
    seen = ran(pytester)
    assert sorted(seen) == ["test_cpu", "test_two_cards"]
    assert len(seen["test_two_cards"].split(",")) == 2, seen  # two devices, not a CPU slot
    assert seen["test_cpu"] == ""
    # pytest's own count includes devpool's deselection.
    result.stdout.fnmatch_lines(["collected 3 items / 1 deselected / 2 selected"])
    assert "test_late.py::test_cuda_only: platform sim not in platforms([cuda])" in (
        result.stdout.lines
    )


def test_collect_only_shows_the_selection_after_platform_deselection(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makepyfile(
        test_plat="""
        import pytest

        @pytest.mark.platforms(["cuda"])
        def test_cuda_only():
            pass

        def test_anywhere():
            pass
        """
    )
    result = run(pytester, tmp_path, "--devices", "sim:0", "--collect-only", "-q")

    assert result.ret == 0, output(result)
    assert "test_plat.py::test_anywhere" in result.stdout.lines
    assert "test_plat.py::test_cuda_only" not in result.stdout.lines


def test_failed_first_starts_last_runs_failures_before_bigger_jobs(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makepyfile(
        test_order="""
        import os
        import pytest

        @pytest.mark.device_count(2)
        def test_big():
            pass

        def test_small_failing():
            assert os.environ.get("FIXED") == "1"
        """
    )
    first = run(pytester, tmp_path, "--devices", "sim:0-1")
    assert first.ret == 1, output(first)

    def planned(*extra: str) -> list[str]:
        result = run(pytester, tmp_path, "--devices", "sim:0-1", "--devpool-plan", *extra)
        assert result.ret == 0, output(result)
        return [line.split()[-1] for line in result.stdout.lines if re.match(r"\s+\d+\s+\S", line)]

    # Without --ff the bigger job starts first; with it, last run's failure does.
    assert planned() == ["test_order.py::test_big", "test_order.py::test_small_failing"]
    assert planned("--ff") == ["test_order.py::test_small_failing", "test_order.py::test_big"]


# ---- the worker runs exactly the planned items ---------------------------------------------


def test_a_conftest_that_shards_by_position_runs_its_own_slice(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    # A home-made shard: keep every second test. Workers collect fewer modules than the
    # controller, so the same slice there picks other tests; the controller's selection wins.
    pytester.makeconftest(
        RAN_CONFTEST
        + """

def pytest_collection_modifyitems(config, items):
    kept = items[0::2]
    config.hook.pytest_deselected(items=[i for i in items if i not in kept])
    items[:] = kept
"""
    )
    pytester.makepyfile(
        test_a="def test_a1(): pass\ndef test_a2(): pass\ndef test_a3(): pass\n",
        test_b="""
        import pytest

        @pytest.mark.device_count(1)
        def test_b1(): pass

        @pytest.mark.device_count(1)
        def test_b2(): pass

        @pytest.mark.device_count(1)
        def test_b3(): pass
        """,
    )
    result = run(pytester, tmp_path, "--devices", "sim:0-1")

    assert result.ret == 0, output(result)
    result.assert_outcomes(passed=3, deselected=3)
    assert sorted(ran(pytester)) == ["test_a1", "test_a3", "test_b2"]


def test_a_lock_folder_given_space_separated_is_refused_before_any_worker_starts(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    # No ini file: pytest guesses the rootdir from the arguments before it knows devpool's
    # options, so the folder would count as a test path beside the project once it exists.
    lock = tmp_path / "new" / "folder"
    pytester.makeconftest(RAN_CONFTEST)
    pytester.makepyfile(
        test_x="""
        import pytest

        def test_cpu():
            pass

        @pytest.mark.device_count(1)
        def test_device():
            pass
        """
    )
    result = pytester.runpytest_subprocess(
        *FAST, "--devpool-lock-dir", str(lock), "--devices", "sim:0", timeout=60
    )

    assert result.ret == 4, output(result)
    assert "write --devpool-lock-dir=DIR" in output(result), output(result)
    assert not ran(pytester)
    assert not lock.exists()


# ---- output survives the process -----------------------------------------------------------


def test_output_of_a_test_that_exits_or_times_out_is_on_disk_beside_the_worker_log(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makepyfile(
        test_crash="""
        import os
        import sys
        import time

        import pytest

        def test_prints_then_exits():
            print("the line before the crash")
            sys.stderr.write("an error line before the crash\\n")
            os._exit(1)

        @pytest.mark.timeout(1)
        def test_prints_then_hangs():
            print("the line before the hang", flush=True)
            time.sleep(120)

        def test_prints_and_fails():
            print("captured as usual")
            assert False
        """
    )
    result = run(
        pytester,
        tmp_path,
        "--devices",
        "sim:0",
        "--devpool-reruns-infra=0",
        "--devpool-timeout-grace=1",
    )

    assert result.ret == 1, output(result)
    # Captured output still reaches pytest's report of a test that ended normally.
    result.stdout.fnmatch_lines(["*Captured stdout call*", "captured as usual"])
    (logs,) = (pytester.path / ".devpool" / "runs").glob("*/logs")
    stdout = {p.name: p.read_text() for p in logs.glob("worker-*.stdout")}
    stderr = {p.name: p.read_text() for p in logs.glob("worker-*.stderr")}
    # The dead workers' files keep what their test wrote; the worker that ended normally
    # left none.
    assert sorted(stdout.values()) == [
        "the line before the crash\n",
        "the line before the hang\n",
    ], stdout
    assert [text for text in stderr.values() if text] == ["an error line before the crash\n"]

    from devpool.worker.capture import crash_output

    (crashed,) = (name for name, text in stdout.items() if "crash" in text)
    text = crash_output(logs / crashed.replace(".stdout", ".log"))
    assert "the line before the crash" in text and "an error line before the crash" in text


# ---- what a newcomer trips on ----------------------------------------------------------------


def test_without_devices_one_line_says_devpool_is_off_and_how_to_turn_it_on(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_marked="""
        import pytest

        @pytest.mark.device_count(2)
        def test_needs_two():
            pass

        def test_plain():
            pass
        """
    )
    result = pytester.runpytest_subprocess(*FAST, timeout=60)

    assert result.ret == 0, output(result)
    result.assert_outcomes(passed=2)
    notes = [line for line in result.stdout.lines if line.startswith("devpool:")]
    assert notes == [
        "devpool: off: 1 test needs devices or ranks (device_count, nodes, ranks) and ran "
        "without device leases, each in one process; "
        'turn devpool on with --devices auto, or devices = "auto" under [tool.devpool] '
        "in pyproject.toml"
    ]

    (pytester.path / "test_marked.py").unlink()
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    quiet = pytester.runpytest_subprocess(*FAST, timeout=60)
    assert quiet.ret == 0, output(quiet)
    assert not [line for line in quiet.stdout.lines if line.startswith("devpool:")]


def test_devices_auto_without_an_accelerator_runs_the_cpu_tests(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    if any(detect(kind) for kind in ("cuda", "ascend", "rocm")):
        pytest.skip("this host has an accelerator: auto finds it")
    pytester.makefile(".toml", pyproject='[tool.devpool]\ndevices = "auto"\n')
    pytester.makeconftest(RAN_CONFTEST)
    pytester.makepyfile(
        test_laptop="""
        import pytest

        @pytest.mark.device_count(1)
        def test_kernel():
            pass

        def test_math():
            pass
        """
    )
    failed = run(pytester, tmp_path)

    assert failed.ret == 1, output(failed)
    assert failed.parseoutcomes() == {"passed": 1, "infra": 1}
    assert sorted(ran(pytester)) == ["test_math"]
    failed.stdout.fnmatch_lines(
        [
            "devpool: auto: no accelerator found (looked for NVIDIA, Ascend and ROCm devices): "
            "CPU tests run, tests that need devices fail as unsatisfiable; max-parallel *"
        ]
    )
    assert "needs 1 device; this session has none (auto: no accelerator found" in (
        failed.stdout.str()
    )

    skipped = run(pytester, tmp_path, "--devpool-skip-unsatisfiable")
    assert skipped.ret == 0, output(skipped)
    skipped.assert_outcomes(passed=1, skipped=1)
