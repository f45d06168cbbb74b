"""End to end: devpool inside real pytest sessions (pytester, real processes, sim devices).

Each test writes a small target project, runs `python -m pytest` on it in a subprocess and
checks what a user would see: the exit status, pytest's closing line, the terminal text and
the files the run leaves behind.
"""

from __future__ import annotations

import re
import stat
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from devpool.report.terminal import SUMMARY_TAIL

# hypothesis's pytest plugin, installed in this environment, costs ~0.5 s per process;
# devpool's workers get the same arguments, so turning it off here speeds every worker too.
FAST = ("-p", "no:hypothesispytest")

# An autouse fixture in the target project that leaves ran/<test name> behind: proof of which
# tests actually ran, whichever process ran them.
RAN_CONFTEST = """
import pathlib

import pytest


@pytest.fixture(autouse=True)
def _record_run(request):
    ran = pathlib.Path(str(request.config.rootpath)) / "ran"
    ran.mkdir(exist_ok=True)
    (ran / request.node.name).touch()
"""


def run(
    pytester: pytest.Pytester, tmp_path: Path, *args: str, lock_dir: Path | None = None
) -> pytest.RunResult:
    """Run pytest in a subprocess with a lock folder of this test's own."""
    lock = lock_dir if lock_dir is not None else tmp_path / "locks"
    return pytester.runpytest_subprocess(*FAST, f"--devpool-lock-dir={lock}", *args, timeout=60)


def ran(pytester: pytest.Pytester) -> list[str]:
    folder = pytester.path / "ran"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def output(result: pytest.RunResult) -> str:
    return result.stdout.str() + "\n" + result.stderr.str()


# ---- 1. a project with its own --platform / --device / --max-parallel options ----------


def test_project_options_that_look_like_devpools_still_work(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makeconftest(
        """
        import pytest

        def pytest_addoption(parser):
            parser.addoption("--platform", default="none")
            parser.addoption("--device", default="-1")
            parser.addoption("--max-parallel", type=int, default=1)

        @pytest.fixture
        def project_options(request):
            get = request.config.getoption
            return get("--platform"), get("--device"), get("--max-parallel")
        """
    )
    pytester.makepyfile(
        test_opts="""
        import os
        import pytest

        def test_cpu(project_options):
            assert project_options == ("foo", "-1", 3)
            assert os.environ["DEVPOOL_PLATFORM"] == "sim"  # ran in a worker

        @pytest.mark.device_count(2)
        def test_two_devices(project_options):
            assert project_options == ("foo", "-1", 3)
            assert len(os.environ["DEVPOOL_DEVICES"].split(",")) == 2
        """
    )
    result = run(
        pytester,
        tmp_path,
        "--devices",
        "sim:0-3",
        "--platform",
        "foo",
        "--max-parallel",
        "3",
        "--devpool-cpu-slots",
        "1",
    )
    assert result.ret == 0, output(result)
    result.assert_outcomes(passed=2)
    # The project's --max-parallel 3 is the project's: devpool's own stays at its default.
    result.stdout.fnmatch_lines(["devpool: sim:0-3 (4 devices)*max-parallel 4, cpu slots 1*"])


# ---- 2. one report per test: terminal and --junitxml --------------------------------------


def test_reports_replayed_once_per_test_terminal_and_junitxml(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makepyfile(
        test_rep="""
        import pytest

        @pytest.mark.device_count(1)
        def test_p1():
            pass

        @pytest.mark.device_count(2)
        def test_p2():
            pass

        def test_p3():
            pass

        @pytest.mark.device_count(1)
        def test_f():
            assert 1 == 2, "boom"
        """
    )
    result = run(pytester, tmp_path, "--devices", "sim:0-3", "-v", "--junitxml=out.xml")
    assert result.ret == 1, output(result)
    result.assert_outcomes(passed=3, failed=1)
    lines = result.stdout.lines
    for name, word in [("p1", "PASSED"), ("p2", "PASSED"), ("p3", "PASSED"), ("f", "FAILED")]:
        where = r"\[(sim:[\d,-]+|cpu)\] \[ *\d+%\]"
        shown = [
            line for line in lines if re.match(rf"{where} {word} test_rep\.py::test_{name}\b", line)
        ]
        assert len(shown) == 1, (name, shown)
        others = [
            line for line in lines if re.match(rf"{where} \w+ test_rep\.py::test_{name}\b", line)
        ]
        assert len(others) == 1, (name, others)

    root = ET.parse(pytester.path / "out.xml").getroot()
    cases = root.findall(".//testcase")
    assert sorted(c.get("name") for c in cases) == ["test_f", "test_p1", "test_p2", "test_p3"]
    suite = root.find("testsuite") if root.tag == "testsuites" else root
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("4", "1", "0")
    failing = {c.get("name"): c.findall("failure") for c in cases}
    assert len(failing["test_f"]) == 1
    assert "boom" in (failing["test_f"][0].get("message") or "")
    assert all(not failing[name] for name in ("test_p1", "test_p2", "test_p3"))


# ---- 3. -x and --maxfail ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "fails", "expect_failed", "expect_ran"),
    [
        ("-x", {"test_2"}, 1, ["test_1", "test_2"]),
        ("--maxfail=2", {"test_1", "test_2"}, 2, ["test_1", "test_2"]),
    ],
)
def test_exitfirst_and_maxfail_stop_the_run(
    pytester: pytest.Pytester,
    tmp_path: Path,
    option: str,
    fails: set[str],
    expect_failed: int,
    expect_ran: list[str],
) -> None:
    pytester.makeconftest(RAN_CONFTEST)
    body = "\n".join(
        f"def test_{i}():\n    assert {'False' if f'test_{i}' in fails else 'True'}\n"
        for i in range(1, 6)
    )
    pytester.makepyfile(test_stop=body)
    # One job at a time, in collection order: "later tests" is then well defined.
    result = run(pytester, tmp_path, "--devices", "sim:0-1", "--devpool-max-parallel", "1", option)
    assert result.ret == 1, output(result)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed") == expect_failed, outcomes
    assert outcomes.get("passed", 0) == len(expect_ran) - expect_failed, outcomes
    assert ran(pytester) == expect_ran
    assert re.search(rf"stopping after {expect_failed} failures|Interrupted", output(result))


# ---- 4. -k and -m -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selection", "expect_ran"),
    [
        (("-k", "alpha or gamma"), ["test_alpha", "test_gamma"]),
        (("-m", "slow"), ["test_beta", "test_gamma"]),
    ],
)
def test_keyword_and_marker_selection(
    pytester: pytest.Pytester,
    tmp_path: Path,
    selection: tuple[str, str],
    expect_ran: list[str],
) -> None:
    pytester.makeconftest(
        RAN_CONFTEST
        + """

def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a slow test")
"""
    )
    pytester.makepyfile(
        test_sel="""
        import pytest

        def test_alpha():
            pass

        @pytest.mark.slow
        def test_beta():
            pass

        @pytest.mark.slow
        @pytest.mark.device_count(1)
        def test_gamma():
            pass
        """
    )
    result = run(pytester, tmp_path, "--devices", "sim:0-1", *selection)
    assert result.ret == 0, output(result)
    result.assert_outcomes(passed=2, deselected=1)
    assert ran(pytester) == expect_ran


# ---- 5. --lf ------------------------------------------------------------------------------


def test_last_failed_reruns_only_the_failure(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makeconftest(RAN_CONFTEST)
    pytester.makepyfile(
        test_lf="""
        def test_ok():
            pass

        def test_bad():
            assert False

        def test_also_ok():
            pass
        """
    )
    first = run(pytester, tmp_path, "--devices", "sim:0-1")
    assert first.ret == 1, output(first)
    first.assert_outcomes(passed=2, failed=1)
    assert ran(pytester) == ["test_also_ok", "test_bad", "test_ok"]

    for path in (pytester.path / "ran").iterdir():
        path.unlink()
    second = run(pytester, tmp_path, "--devices", "sim:0-1", "--lf")
    assert second.ret == 1, output(second)
    second.assert_outcomes(failed=1)  # as plain pytest: filtered at collection
    assert ran(pytester) == ["test_bad"]
    second.stdout.fnmatch_lines(["*rerun previous 1 failure*"])


# ---- 6. platforms marker and project platforms ---------------------------------------------


def test_platforms_marker_deselects_with_reason(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makeconftest(RAN_CONFTEST)
    pytester.makepyfile(
        test_plat="""
        import pytest

        @pytest.mark.platforms(["cuda"])
        def test_cuda_only():
            pass

        @pytest.mark.platforms(["sim"])
        def test_sim_ok():
            pass
        """
    )
    result = run(pytester, tmp_path, "--devices", "sim:0-1")
    assert result.ret == 0, output(result)
    result.assert_outcomes(passed=1, deselected=1)
    # The reason, as written (fnmatch would read "[cuda]" as a character class).
    assert "test_plat.py::test_cuda_only: platform sim not in platforms([cuda])" in (
        result.stdout.lines
    )
    assert ran(pytester) == ["test_sim_ok"]


def test_project_platform_from_pyproject(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makefile(
        ".toml",
        pyproject="""
        [tool.devpool.platforms]
        a2a3sim = "sim"
        """,
    )
    pytester.makepyfile(
        test_a2a3="""
        import os
        import pytest

        @pytest.mark.platforms(["a2a3sim"])
        @pytest.mark.device_count(1)
        def test_on_a2a3sim():
            assert os.environ["DEVPOOL_PLATFORM"] == "a2a3sim"
            assert os.environ["DEVPOOL_DEVICES"] in ("0", "1")

        @pytest.mark.platforms(["cuda"])
        def test_cuda_only():
            pass
        """
    )
    result = run(pytester, tmp_path, "--devices", "a2a3sim:0-1")
    assert result.ret == 0, output(result)
    result.assert_outcomes(passed=1, deselected=1)
    assert "test_a2a3.py::test_cuda_only: platform a2a3sim not in platforms([cuda])" in (
        result.stdout.lines
    )


# ---- 7. bad input: exit 4, one clear line, no traceback -----------------------------------

BAD_MARKERS = {
    "device_count-str": ('@pytest.mark.device_count("2")', ["device_count"]),
    "device_count-zero": ("@pytest.mark.device_count(0)", ["device_count"]),
    "device_count-negative": ("@pytest.mark.device_count(-1)", ["device_count"]),
    "device_count-empty": ("@pytest.mark.device_count()", ["device_count"]),
    "platforms-unknown": ('@pytest.mark.platforms(["nosuch"])', ["platforms", "nosuch"]),
    "timeout-negative": ("@pytest.mark.timeout(-1)", ["timeout"]),
}


def assert_usage_error(result: pytest.RunResult, needles: list[str]) -> None:
    text = output(result)
    assert result.ret == 4, text
    assert "Traceback" not in text, text
    assert "INTERNALERROR" not in text, text
    naming = [line for line in text.splitlines() if all(n in line for n in needles)]
    assert naming, f"no line names all of {needles}:\n{text}"


@pytest.mark.parametrize("case", list(BAD_MARKERS), ids=list(BAD_MARKERS))
def test_bad_marker_is_a_usage_error(pytester: pytest.Pytester, tmp_path: Path, case: str) -> None:
    marker, needles = BAD_MARKERS[case]
    pytester.makepyfile(test_bad=f"import pytest\n\n\n{marker}\ndef test_x():\n    pass\n")
    result = run(pytester, tmp_path, "--devices", "sim:0-1")
    assert_usage_error(result, ["test_bad.py::test_x", *needles])


BAD_OPTIONS = {
    "devices-no-ids": (["--devices", "cuda:"], None, ["--devices", "cuda:"]),
    "devices-unknown-platform": (["--devices", "nosuch:0-3"], None, ["--devices", "nosuch"]),
    "devices-backwards": (["--devices", "sim:3-1"], None, ["--devices", "3-1"]),
    "table-unknown-key": (
        ["--devices", "sim:0-1"],
        "[tool.devpool]\nbogus = 1\n",
        ["pyproject.toml", "bogus"],
    ),
    "table-bad-value": (
        ["--devices", "sim:0-1"],
        '[tool.devpool]\nmax-parallel = "many"\n',
        ["pyproject.toml", "max-parallel", "many"],
    ),
    "table-invalid-toml": (
        ["--devices", "sim:0-1"],
        "[tool.devpool\nmax-parallel = 2\n",
        ["pyproject.toml"],
    ),
    "github-both-ways": (
        ["--devices", "sim:0-1", "--devpool-github", "--devpool-no-github"],
        None,
        ["--devpool-github", "--devpool-no-github"],
    ),
    "max-parallel-zero": (
        ["--devices", "sim:0-1", "--devpool-max-parallel", "0"],
        None,
        ["--devpool-max-parallel", "0"],
    ),
}


@pytest.mark.parametrize("case", list(BAD_OPTIONS), ids=list(BAD_OPTIONS))
def test_bad_option_or_config_is_a_usage_error(
    pytester: pytest.Pytester, tmp_path: Path, case: str
) -> None:
    args, pyproject, needles = BAD_OPTIONS[case]
    if pyproject is not None:
        (pytester.path / "pyproject.toml").write_text(pyproject, encoding="utf-8")
    pytester.makepyfile(test_fine="def test_x():\n    pass\n")
    result = run(pytester, tmp_path, *args)
    assert_usage_error(result, needles)


@pytest.mark.parametrize("devices", [("--devices", "sim:0-1"), ()], ids=["devices", "dormant"])
def test_path_option_with_a_separate_value_is_a_usage_error(
    pytester: pytest.Pytester, tmp_path: Path, devices: tuple[str, ...]
) -> None:
    # With no test path, pytest takes the folder for one and moves its rootdir there.
    pytester.makepyfile(test_fine="def test_x():\n    pass\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = pytester.runpytest_subprocess(
        *FAST, *devices, "--devpool-lock-dir", str(elsewhere), timeout=60
    )
    assert_usage_error(result, ["--devpool-lock-dir"])
    sentence = (
        "write --devpool-lock-dir=DIR: written with a space, its value changed the rootdir "
        "or ini file pytest chose before it knew devpool's options"
    )
    assert sentence in output(result), output(result)
    glued = run(pytester, tmp_path, *devices, f"--devpool-run-dir={tmp_path / 'run'}")
    assert glued.ret == 0, output(glued)


def test_unwritable_lock_folder_is_a_usage_error(pytester: pytest.Pytester, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder", encoding="utf-8")
    pytester.makepyfile(test_fine="def test_x():\n    pass\n")
    lock = blocker / "locks"
    result = run(pytester, tmp_path, "--devices", "sim:0-1", lock_dir=lock)
    assert_usage_error(result, [str(lock)])


# ---- 8. more devices than the pool ---------------------------------------------------------


def test_unsatisfiable_request_is_infra_or_skipped(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makepyfile(
        test_big="""
        import pytest

        @pytest.mark.device_count(8)
        def test_needs_eight():
            pass
        """
    )
    failed = run(pytester, tmp_path, "--devices", "sim:0-3")
    assert failed.ret == 1, output(failed)
    assert failed.parseoutcomes() == {"infra": 1}
    failed.stdout.fnmatch_lines(["*INFRA*test_big.py::test_needs_eight*"])
    assert "needs 8 sim devices; the pool has 4" in failed.stdout.str()
    assert re.search(r"=+ 1 infra in ", failed.stdout.str())

    skipped = run(pytester, tmp_path, "--devices", "sim:0-3", "--devpool-skip-unsatisfiable", "-rs")
    assert skipped.ret == 0, output(skipped)
    skipped.assert_outcomes(skipped=1)
    skipped.stdout.fnmatch_lines(["SKIPPED*needs 8 sim devices; the pool has 4*"])


# ---- 9. --devpool-plan ---------------------------------------------------------------------


def test_plan_prints_jobs_in_order_and_runs_nothing(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makeconftest(RAN_CONFTEST)
    pytester.makepyfile(
        test_plan="""
        import pytest

        def test_cpu():
            pass

        @pytest.mark.device_count(1)
        def test_one():
            pass

        @pytest.mark.device_count(4)
        def test_four():
            pass

        @pytest.mark.device_count(2)
        def test_two():
            pass
        """
    )
    result = run(pytester, tmp_path, "--devices", "sim:0-3", "--devpool-plan")
    assert result.ret == 0, output(result)
    plan = [line for line in result.stdout.lines if re.match(r"\s+\d+\s+\S", line)]
    assert [line.split()[-1] for line in plan] == [
        "test_plan.py::test_four",
        "test_plan.py::test_two",
        "test_plan.py::test_one",
        "test_plan.py::test_cpu",
    ], result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "devpool plan: 4 jobs on sim:0-3*",
            "*1  4 devices*test_plan.py::test_four",
            "*2  2 devices*test_plan.py::test_two",
            "*3  1 device *test_plan.py::test_one",
            "*4  cpu *test_plan.py::test_cpu",
        ]
    )
    assert ran(pytester) == []
    assert "passed" not in result.stdout.lines[-1]


# ---- 10. the failure summary ---------------------------------------------------------------


def test_failure_summary_shows_log_path_and_tail(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makepyfile(
        test_tail="""
        def test_noisy():
            for i in range(1, 81):
                print(f"noisy {i:03d}")
            assert False, "the end"
        """
    )
    result = run(pytester, tmp_path, "--devices", "sim:0-1")
    assert result.ret == 1, output(result)
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if "devpool: 1 test did not pass" in line)
    end = next(
        (i for i, line in enumerate(lines) if i > start and "short test summary info" in line),
        len(lines),
    )
    section = lines[start:end]
    assert any(re.match(r"FAILED\s+test_tail\.py::test_noisy", line) for line in section)
    log_lines = [line for line in section if line.startswith("  log: ")]
    assert len(log_lines) == 1, section
    log = pytester.path / log_lines[0][len("  log: ") :].strip()
    assert log.is_file()
    text = log.read_text(encoding="utf-8")
    assert all(f"noisy {i:03d}" in text for i in range(1, 81))
    assert "  | noisy 079" in section
    assert "  | noisy 080" in section
    assert not any("noisy 001" in line for line in section)
    tail = [line for line in section if line.startswith("  | ")]
    assert len(tail) == SUMMARY_TAIL  # a few last lines: FAILURES above holds the whole failure


# ---- 11. [tool.devpool] -------------------------------------------------------------------


def test_pyproject_devices_activates_devpool_and_command_line_wins(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makefile(
        ".toml",
        pyproject="""
        [tool.devpool]
        devices = "sim:0-1"
        max-parallel = 1
        """,
    )
    pytester.makepyfile(
        test_table="""
        import os
        import pytest

        @pytest.mark.device_count(2)
        def test_two():
            assert sorted(os.environ["DEVPOOL_DEVICES"].split(",")) == ["0", "1"]
        """
    )
    from_table = run(pytester, tmp_path)
    assert from_table.ret == 0, output(from_table)
    from_table.assert_outcomes(passed=1)
    from_table.stdout.fnmatch_lines(["devpool: sim:0,1 (2 devices)*max-parallel 1,*"])

    pytester.makepyfile(
        test_table="""
        import os
        import pytest

        @pytest.mark.device_count(3)
        def test_three():
            assert sorted(os.environ["DEVPOOL_DEVICES"].split(",")) == ["0", "1", "2"]
        """
    )
    from_cli = run(pytester, tmp_path, "--devices", "sim:0-2", "--devpool-max-parallel", "2")
    assert from_cli.ret == 0, output(from_cli)
    from_cli.assert_outcomes(passed=1)
    from_cli.stdout.fnmatch_lines(["devpool: sim:0-2 (3 devices) from --devices*max-parallel 2,*"])


# ---- 12. no --devices: plain pytest -------------------------------------------------------


def test_without_devices_devpool_stays_out_of_the_way(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makeconftest(
        """
        import os
        import pathlib

        def pytest_sessionstart(session):
            pathlib.Path("session.pid").write_text(str(os.getpid()))
        """
    )
    pytester.makepyfile(
        test_plain="""
        import os
        import pathlib
        import pytest

        @pytest.mark.device_count(2)
        @pytest.mark.platforms(["cuda"])
        @pytest.mark.isolate
        @pytest.mark.timeout(30)
        def test_marked():
            assert "DEVPOOL_DEVICES" not in os.environ
            pathlib.Path("test.pid").write_text(str(os.getpid()))

        def test_plain():
            pass
        """
    )
    result = run(
        pytester, tmp_path, "--strict-markers", "-W", "error::pytest.PytestUnknownMarkWarning"
    )
    assert result.ret == 0, output(result)
    result.assert_outcomes(passed=2)
    assert "PytestUnknownMarkWarning" not in output(result)
    # One line says devpool is off (tests/e2e/test_collection.py checks its words).
    notes = [line for line in result.stdout.lines if line.startswith("devpool:")]
    assert len(notes) == 1 and notes[0].startswith("devpool: off:"), notes
    session_pid = (pytester.path / "session.pid").read_text()
    assert (pytester.path / "test.pid").read_text() == session_pid  # ran in-process
    assert not (pytester.path / ".devpool").exists()


# ---- 13. warm workers keep module fixtures ------------------------------------------------


def test_module_fixture_is_reused_by_a_warm_worker(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makepyfile(
        test_warm="""
        import pathlib
        import pytest

        LOG = pathlib.Path(__file__).with_name("fixture.log")

        @pytest.fixture(scope="module")
        def resource():
            with LOG.open("a") as f:
                f.write("setup\\n")
            yield
            with LOG.open("a") as f:
                f.write("teardown\\n")

        @pytest.mark.parametrize("n", range(5))
        def test_uses(resource, n):
            pass
        """
    )
    result = run(pytester, tmp_path, "--devices", "sim:0-1", "--devpool-cpu-slots", "1")
    assert result.ret == 0, output(result)
    result.assert_outcomes(passed=5)
    events = (pytester.path / "fixture.log").read_text().split()
    setups, teardowns = events.count("setup"), events.count("teardown")
    assert 1 <= setups < 5, events
    assert setups == 1, events
    assert teardowns == setups, events


# ---- 14. setup errors, skips, xfails ------------------------------------------------------


def test_setup_error_skip_and_xfail_outcomes(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makepyfile(
        test_kinds="""
        import pytest

        @pytest.fixture
        def broken():
            raise RuntimeError("fixture broke")

        def test_error(broken):
            pass

        def test_skipped():
            pytest.skip("not today")

        @pytest.mark.xfail(reason="known bug")
        def test_xfailed():
            assert False

        @pytest.mark.device_count(1)
        def test_passed():
            pass
        """
    )
    result = run(pytester, tmp_path, "--devices", "sim:0-1")
    assert result.ret == 1, output(result)
    result.assert_outcomes(passed=1, errors=1, skipped=1, xfailed=1)
    result.stdout.fnmatch_lines(["ERROR test_kinds.py::test_error - RuntimeError: fixture broke"])
    assert "Traceback" not in output(result)


def test_skip_and_xfail_reasons_in_short_summary(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """-rsx lists skip and xfail reasons, as plain pytest does, from reports sent by workers."""
    pytester.makepyfile(
        test_reasons="""
        import pytest

        def test_ok():
            pass

        def test_skipped():
            pytest.skip("not today")

        @pytest.mark.xfail(reason="known bug")
        def test_xfailed():
            assert False
        """
    )
    result = run(pytester, tmp_path, "--devices", "sim:0-1", "-rsx")
    assert result.ret == 0, output(result)
    assert "Traceback" not in output(result)
    result.assert_outcomes(passed=1, skipped=1, xfailed=1)
    result.stdout.fnmatch_lines_random(
        [
            "SKIPPED [[]1[]] test_reasons.py:*: not today",
            "XFAIL test_reasons.py::test_xfailed - known bug",
        ]
    )


def test_old_run_folders_are_pruned_and_other_folders_left_alone(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    runs = pytester.path / ".devpool" / "runs"
    old = [f"20260101-00000{i}-{100 + i}" for i in range(5)]
    for name in old:
        (runs / name).mkdir(parents=True)
    (runs / "keep-me").mkdir()
    pytester.makepyfile(test_one="def test_one():\n    pass\n")

    result = run(pytester, tmp_path, "--devices", "sim:0", "--devpool-keep-runs", "2")

    assert result.ret == 0, output(result)
    left = sorted(p.name for p in runs.iterdir())
    assert "keep-me" in left  # not a folder devpool made
    assert old[-1] in left and not set(old[:-1]) & set(left)
    assert len(left) == 3  # the newest old run, this run, and keep-me
    (made,) = set(left) - {"keep-me", old[-1]}
    assert stat.S_IMODE((runs / made).stat().st_mode) == 0o700  # this user's alone


@pytest.mark.parametrize("fork_server", [False, True], ids=["fresh", "fork-server"])
def test_a_worker_imports_only_the_modules_of_its_own_kind_of_job(
    pytester: pytest.Pytester, tmp_path: Path, fork_server: bool
) -> None:
    # The device-only module leaves a mark when a CPU-only process imports it: which
    # process (a fork server's template, or a worker).
    marks = tmp_path / "imported-by-cpu-process"
    pytester.makepyfile(
        test_gpu_only=f"""
        import os
        import sys

        import pytest

        if os.environ.get("DEVPOOL_DEVICES") == "":
            role = "template" if "template," in " ".join(sys.argv) else "worker"
            with open({str(marks)!r}, "a") as mark:
                mark.write(role + "\\n")

        @pytest.mark.device_count(1)
        def test_kernel():
            pass
        """,
        test_cpu_only="def test_math():\n    assert 1 + 1 == 2\n",
    )
    extra = [] if fork_server else ["--devpool-no-fork-server"]
    result = run(pytester, tmp_path, "--devices", "sim:0", *extra)

    assert result.ret == 0, output(result)
    result.assert_outcomes(passed=2)
    imported = marks.read_text().split() if marks.exists() else []
    if fork_server:
        # The CPU-only template collects while the controller does, before it is known
        # which modules hold CPU-only tests: it imports every module, once; the workers
        # forked from it import nothing again.
        assert imported == ["template"], imported
    else:
        assert imported == [], "the CPU-only worker imported the device-only module"
