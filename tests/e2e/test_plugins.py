"""The plugin matrix: plugins GPU projects install, in plain pytest and under devpool.

All of them are installed together (the [dev] extra). For each, a small project runs in
plain pytest and under `--devices sim:0-3`, and the two runs must agree: the same outcomes,
the same coverage %, the same random values, the same number of attempts per test.
Nothing is installed at test time.
"""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

DEVPOOL = ("--devices", "sim:0-3")

# A module under test: some of it runs only when tests call it, so coverage that misses the
# workers shows a lower %.
CALC = """
def add(a, b):
    return a + b


def div(a, b):
    if b == 0:
        raise ZeroDivisionError("b is 0")
    return a / b


def clamp(x, low, high):
    if x < low:
        return low
    if x > high:
        return high
    return x


def never_called():
    total = 0
    for i in range(10):
        total += i
    return total
"""

CALC_TESTS = """
import pytest

import calc


@pytest.mark.device_count(1)
def test_add():
    assert calc.add(2, 3) == 5


@pytest.mark.device_count(2)
def test_div():
    assert calc.div(6, 3) == 2
    with pytest.raises(ZeroDivisionError):
        calc.div(1, 0)


def test_clamp_low():
    assert calc.clamp(-5, 0, 10) == 0


@pytest.mark.device_count(1)
def test_fails():
    assert calc.add(1, 1) == 3


@pytest.mark.skip(reason="not today")
def test_skipped():
    calc.clamp(50, 0, 10)


@pytest.mark.xfail(reason="known")
def test_xfail():
    assert calc.clamp(5, 0, 1) == 5
"""
CALC_OUTCOMES = {"passed": 3, "failed": 1, "skipped": 1, "xfailed": 1}


@pytest.fixture(autouse=True)
def _every_plugin_on(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The matrix runs with every installed plugin on, pytest-randomly included."""
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    monkeypatch.delenv("COVERAGE_PROCESS_START", raising=False)
    monkeypatch.delenv("COVERAGE_PROCESS_CONFIG", raising=False)


def pytest_run(pytester: pytest.Pytester, tmp_path: Path, *args: str) -> pytest.RunResult:
    """One real pytest session in a subprocess (a lock folder of this test's own)."""
    return pytester.runpytest_subprocess(
        f"--devpool-lock-dir={tmp_path / 'locks'}", *args, timeout=180
    )


def text(result: pytest.RunResult) -> str:
    return result.stdout.str() + "\n" + result.stderr.str()


def outcomes(result: pytest.RunResult) -> dict[str, int]:
    """pytest's closing line, with devpool's `flaky` counted as the pass it is by default."""
    ignored = ("seconds", "rerun", "warnings")
    counts = {k: v for k, v in result.parseoutcomes().items() if k not in ignored}
    counts = {("passed" if k == "flaky" else k): v for k, v in counts.items()}
    if "flaky" in result.parseoutcomes():
        counts["passed"] = result.parseoutcomes().get("passed", 0) + counts["passed"]
    return counts


def no_plugin_crash(result: pytest.RunResult) -> None:
    """What a worker that believed it was an xdist worker printed."""
    out = text(result)
    for words in ("KeyError", "cov_master_host", "randomly_seed'", "sock_port", "INTERNALERROR"):
        assert words not in out, out


# ---- pytest-cov ---------------------------------------------------------------------------


def test_pytest_cov_same_percent_and_reports_as_plain_pytest(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makepyfile(calc=CALC, test_calc=CALC_TESTS)
    reports = (
        "--cov=calc",
        "--cov-report=term-missing",
        "--cov-report=xml:cov.xml",
        "--cov-report=json:cov.json",
        "--cov-report=html:htmlcov",
    )
    results = {}
    for name, extra in (("plain", ()), ("devpool", DEVPOOL)):
        result = pytest_run(pytester, tmp_path, *reports, *extra)
        assert result.ret == 1, text(result)
        no_plugin_crash(result)
        total = re.search(r"^TOTAL\s+\d+\s+\d+\s+(\d+%)", result.stdout.str(), re.M)
        assert total is not None, text(result)
        percent = json.loads((pytester.path / "cov.json").read_text())["totals"]
        line_rate = ET.parse(pytester.path / "cov.xml").getroot().get("line-rate")
        assert (pytester.path / "htmlcov" / "index.html").is_file()
        missing = re.search(r"^calc\.py\s+.*$", result.stdout.str(), re.M)
        assert missing is not None
        results[name] = (outcomes(result), total[1], percent, line_rate, missing[0])
        # The workers' data files were combined into the report, none left behind.
        assert not list(pytester.path.glob(".coverage.*")), list(pytester.path.iterdir())
    assert results["devpool"] == results["plain"]
    assert results["plain"][0] == CALC_OUTCOMES
    # Lines only the tests run are in the total: the workers were measured.
    assert 50 < results["devpool"][2]["percent_covered"] < 100


def test_pytest_cov_no_cover_and_fail_under_as_in_plain_pytest(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makepyfile(
        calc=CALC,
        test_cover="""
        import pytest

        import calc

        @pytest.mark.device_count(1)
        def test_add():
            assert calc.add(1, 2) == 3

        @pytest.mark.no_cover
        @pytest.mark.device_count(1)
        def test_not_measured():
            assert calc.clamp(50, 0, 10) == 10
        """,
    )
    args = ("--cov=calc", "--cov-report=json:cov.json", "--cov-fail-under=99")
    seen = []
    for extra in ((), DEVPOOL):
        result = pytest_run(pytester, tmp_path, *args, *extra)
        no_plugin_crash(result)
        assert result.ret == 1, text(result)  # coverage under 99%: pytest-cov fails the run
        result.stdout.fnmatch_lines(["*FAIL Required test coverage of 99% not reached*"])
        seen.append(json.loads((pytester.path / "cov.json").read_text())["totals"])
    assert seen[0] == seen[1]


# ---- coverage run -------------------------------------------------------------------------


def test_coverage_run_parallel_measures_the_workers(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makepyfile(calc=CALC, test_calc=CALC_TESTS)
    (pytester.path / ".coveragerc").write_text("[run]\nparallel = true\nsource = calc\n")
    lock = f"--devpool-lock-dir={tmp_path / 'locks'}"
    totals = []
    for extra in ((), DEVPOOL):
        for old in pytester.path.glob(".coverage*"):
            if old.name != ".coveragerc":
                old.unlink()
        ran = pytester.run(sys.executable, "-m", "coverage", "run", "-m", "pytest", lock, *extra)
        assert ran.ret == 1, text(ran)
        no_plugin_crash(ran)
        assert outcomes(ran) == CALC_OUTCOMES
        # The controller and each worker wrote a data file of its own.
        files = list(pytester.path.glob(".coverage.*"))
        assert len(files) >= (2 if extra else 1), files
        assert pytester.run(sys.executable, "-m", "coverage", "combine").ret == 0
        report = pytester.run(sys.executable, "-m", "coverage", "report", "--format=total")
        totals.append(report.stdout.str().strip())
    assert totals[0] == totals[1], totals
    assert 50 < int(totals[0]) < 100


# ---- pytest-randomly ----------------------------------------------------------------------

RANDOM_TESTS = """
import pathlib
import random

import pytest


def keep(request):
    out = pathlib.Path(str(request.config.rootpath)) / "values"
    out.mkdir(exist_ok=True)
    (out / request.node.name).write_text(repr(random.random()))


@pytest.mark.device_count(1)
def test_a(request):
    keep(request)


@pytest.mark.device_count(1)
def test_b(request):
    keep(request)


def test_c(request):
    keep(request)


@pytest.mark.device_count(2)
def test_d(request):
    keep(request)
"""


def values(pytester: pytest.Pytester) -> dict[str, str]:
    folder = pytester.path / "values"
    found = {p.name: p.read_text() for p in folder.iterdir()}
    for path in folder.iterdir():
        path.unlink()
    return found


def test_randomly_one_seed_for_the_run_reproducible_by_its_number(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makepyfile(test_random=RANDOM_TESTS)
    first = pytest_run(pytester, tmp_path, *DEVPOOL)
    assert first.ret == 0, text(first)
    no_plugin_crash(first)
    seed = re.search(r"Using --randomly-seed=(\d+)", first.stdout.str())
    assert seed is not None, text(first)
    under_devpool = values(pytester)
    assert len(under_devpool) == 4

    plain = pytest_run(pytester, tmp_path, f"--randomly-seed={seed[1]}")
    assert plain.ret == 0, text(plain)
    # Every worker used the header's seed: each test saw what plain pytest shows it.
    assert values(pytester) == under_devpool

    again = pytest_run(pytester, tmp_path, f"--randomly-seed={seed[1]}", *DEVPOOL)
    assert again.ret == 0, text(again)
    again.stdout.fnmatch_lines([f"Using --randomly-seed={seed[1]}"])
    assert values(pytester) == under_devpool


# ---- pytest-rerunfailures -----------------------------------------------------------------

RERUN_TESTS = """
import pathlib

import pytest


def attempt(request):
    out = pathlib.Path(str(request.config.rootpath)) / "attempts"
    out.mkdir(exist_ok=True)
    path = out / request.node.name
    count = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(count))
    return count


@pytest.mark.device_count(1)
def test_second_time_lucky(request):
    assert attempt(request) >= 2


@pytest.mark.device_count(1)
def test_always_fails(request):
    attempt(request)
    assert False


@pytest.mark.flaky(reruns=3)
@pytest.mark.device_count(1)
def test_marked_third_time(request):
    assert attempt(request) >= 3


def test_passes(request):
    attempt(request)
"""


def attempts(pytester: pytest.Pytester) -> dict[str, int]:
    folder = pytester.path / "attempts"
    found = {p.name: int(p.read_text()) for p in folder.iterdir()}
    for path in folder.iterdir():
        path.unlink()
    return found


def test_rerunfailures_reruns_become_devpool_reruns_with_honest_attempts(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makepyfile(test_rerun=RERUN_TESTS)
    plain = pytest_run(pytester, tmp_path, "--reruns", "1")
    assert plain.ret == 1, text(plain)
    plain_attempts = attempts(pytester)
    assert plain_attempts == {
        "test_second_time_lucky": 2,
        "test_always_fails": 2,
        "test_marked_third_time": 3,
        "test_passes": 1,
    }

    result = pytest_run(pytester, tmp_path, "--reruns", "1", "-rA", *DEVPOOL)
    assert result.ret == 1, text(result)
    no_plugin_crash(result)
    # Each attempt ran once, in devpool's hands: pytest-rerunfailures did not rerun inside.
    assert attempts(pytester) == plain_attempts
    assert outcomes(result) == outcomes(plain) == {"passed": 3, "failed": 1}
    result.stdout.fnmatch_lines(["devpool: --reruns (pytest-rerunfailures) 1 runs as devpool*"])
    # Fail-then-pass is flaky, and said so.
    out = result.stdout.str()
    assert re.search(r"FLAKY.*test_second_time_lucky", out), out
    assert re.search(r"FLAKY.*test_marked_third_time", out), out
    assert re.search(r"FAILED.*test_always_fails", out), out


# ---- pytest-timeout -----------------------------------------------------------------------

TIMEOUT_TESTS = """
import time

import pytest


@pytest.mark.timeout(1)
@pytest.mark.device_count(1)
def test_marked_hang():
    time.sleep(60)


@pytest.mark.device_count(1)
def test_default_hang():
    time.sleep(60)


@pytest.mark.timeout(0)
def test_no_limit():
    time.sleep(0.1)


def test_quick():
    pass
"""


def test_timeout_marker_and_option_are_devpools_under_devpool(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makepyfile(test_hang=TIMEOUT_TESTS)
    args = ("--timeout", "2", "-rA", "--devpool-timeout-grace", "1")
    plain = pytest_run(pytester, tmp_path, *args)
    assert plain.ret == 1, text(plain)
    assert outcomes(plain) == {"passed": 2, "failed": 2}
    assert "Timeout (>1.0s) from pytest-timeout" in plain.stdout.str()

    result = pytest_run(pytester, tmp_path, *args, *DEVPOOL)
    assert result.ret == 1, text(result)
    no_plugin_crash(result)
    out = result.stdout.str()
    result.stdout.fnmatch_lines(["devpool: --timeout (pytest-timeout) 2.0 is enforced by devpool*"])
    # devpool's deadline, not pytest-timeout's failure inside the worker.
    assert "from pytest-timeout" not in out, out
    assert re.search(r"TIMEOUT.*test_marked_hang", out), out
    assert re.search(r"TIMEOUT.*test_default_hang", out), out
    assert re.search(r"PASSED.*test_no_limit", out), out
    counts = result.parseoutcomes()
    assert counts.get("passed") == 2, counts


# ---- hypothesis ---------------------------------------------------------------------------


def test_hypothesis_finds_and_shows_the_same_counterexample(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makepyfile(
        test_props="""
        import pytest
        from hypothesis import given, settings, strategies as st

        @pytest.mark.device_count(1)
        @settings(max_examples=50, database=None, derandomize=True)
        @given(st.integers(), st.integers())
        def test_add_commutes(a, b):
            assert a + b == b + a

        @settings(max_examples=200, database=None, derandomize=True)
        @given(st.integers(min_value=0, max_value=1000))
        def test_small(x):
            assert x < 500
        """
    )
    plain = pytest_run(pytester, tmp_path)
    result = pytest_run(pytester, tmp_path, *DEVPOOL)
    no_plugin_crash(result)
    assert result.ret == plain.ret == 1, text(result)
    assert outcomes(result) == outcomes(plain) == {"passed": 1, "failed": 1}
    # hypothesis's report of the counterexample is plain pytest's own output from this run
    # (its wording changes between hypothesis versions), shown the same under devpool.
    shown = error_lines(plain)
    assert any("x=500" in line for line in shown), plain.stdout.str()
    assert error_lines(result) == shown, text(result)


def error_lines(result: pytest.RunResult) -> list[str]:
    """The `E   ` lines of a run's failure sections, as pytest printed them."""
    return [line for line in result.stdout.lines if line.startswith("E ")]


# ---- pytest-asyncio -----------------------------------------------------------------------


def test_pytest_asyncio_tests_and_fixtures_run_in_workers(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makepyfile(
        test_async="""
        import asyncio
        import os

        import pytest
        import pytest_asyncio

        @pytest_asyncio.fixture
        async def value():
            await asyncio.sleep(0)
            yield 41

        @pytest.mark.asyncio
        @pytest.mark.device_count(1)
        async def test_awaits(value):
            await asyncio.sleep(0.01)
            assert value + 1 == 42

        @pytest.mark.asyncio
        async def test_async_fails(value):
            assert value == 0

        def test_sync():
            assert True
        """
    )
    plain = pytest_run(pytester, tmp_path)
    result = pytest_run(pytester, tmp_path, *DEVPOOL)
    no_plugin_crash(result)
    assert result.ret == plain.ret == 1, text(result)
    assert outcomes(result) == outcomes(plain) == {"passed": 2, "failed": 1}


# ---- pytest-order and pytest-dependency ---------------------------------------------------

ORDERED = """
import pytest

STATE = []


@pytest.mark.order(3)
def test_third():
    assert STATE == ["first", "second"]


@pytest.mark.order(1)
@pytest.mark.device_count(1)
def test_first():
    STATE.append("first")


@pytest.mark.order(2)
def test_second():
    assert STATE == ["first"]
    STATE.append("second")


@pytest.mark.parametrize("i", range(12))
def test_free(i):
    pass
"""

DEPENDENT = """
import pytest


@pytest.mark.dependency()
def test_base_fails():
    assert False


@pytest.mark.dependency()
def test_base_passes():
    pass


@pytest.mark.dependency(depends=["test_base_fails"])
def test_needs_the_failure():
    pass


@pytest.mark.dependency(depends=["test_base_passes"])
def test_needs_the_pass():
    pass


@pytest.mark.dependency(depends=["test_needs_the_pass"])
def test_needs_a_dependent():
    pass


@pytest.mark.parametrize("i", range(12))
def test_free(i):
    pass
"""


@pytest.mark.parametrize("isolation", ["worker", "module", "job"])
def test_order_and_dependency_chains_run_as_in_plain_pytest(
    pytester: pytest.Pytester, tmp_path: Path, isolation: str
) -> None:
    pytester.makepyfile(test_ordered=ORDERED, test_dependent=DEPENDENT)
    plain = pytest_run(pytester, tmp_path, "-p", "no:randomly", "-rA")
    assert outcomes(plain) == {"failed": 1, "passed": 30, "skipped": 1}, text(plain)

    result = pytest_run(
        pytester, tmp_path, "-p", "no:randomly", "-rA", *DEVPOOL, f"--devpool-isolation={isolation}"
    )

    assert outcomes(result) == outcomes(plain), text(result)
    no_plugin_crash(result)

    def summary(run: pytest.RunResult) -> set[str]:
        # pytest's short summary (-rA), not devpool's own "FAILED   id  [cpu]" lines
        return {line for line in run.outlines if re.match(r"(PASSED|FAILED|SKIPPED) \S", line)}

    assert summary(result) == summary(plain)
    assert "SKIPPED" in text(result) and "test_needs_the_failure" in text(result)
