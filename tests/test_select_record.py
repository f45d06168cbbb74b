"""The worker-side recorder (select/record.py) in a real pytest session, without devpool's
controller: what each test's teardown report carries, now that reports and the time
between tests run untraced."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

PLUGIN = """
    import json, os
    import pytest
    from devpool.select.record import DEPS_ATTR, Recorder

    def pytest_configure(config):
        recorder = Recorder(config.rootpath)
        recorder.install()
        config.pluginmanager.register(recorder, "recorder")

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(report):
        deps = getattr(report, DEPS_ATTR, None)
        if deps is not None:
            with open(os.environ["DEPS_OUT"], "a") as out:
                out.write(json.dumps(deps) + "\\n")
    """

LIB = """
    def first():
        return 1


    def second():
        return 2


    def between():
        return 3
    """


def recorded(pytester: pytest.Pytester, *args: str) -> dict[str, dict[str, Any]]:
    """The deps of each test's last teardown report."""
    return {deps["nodeid"]: deps for deps in attempts(pytester, *args)}


def attempts(pytester: pytest.Pytester, *args: str) -> list[dict[str, Any]]:
    """The deps of every teardown report, in order."""
    out = pytester.path / "deps.jsonl"
    pytester.makepyfile(recording_plugin=textwrap.dedent(PLUGIN), lib=textwrap.dedent(LIB))
    pytester.makeini("[pytest]\npythonpath = .\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DEPS_OUT", str(out))
        pytester.runpytest_subprocess("-p", "recording_plugin", "-p", "no:devpool", *args)
    return [json.loads(line) for line in out.read_text().splitlines()]


def functions(deps: dict[str, Any]) -> set[str]:
    return {key.split("::", 1)[1] for key in deps.get("blocks", {}) if key.startswith("lib.py")}


def test_what_runs_between_tests_and_in_report_hooks_is_nobody_s(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(
        """
        import lib

        def pytest_runtest_logreport(report):
            lib.between()
        """
    )
    pytester.makepyfile(
        test_a="""
        import lib

        def test_one():
            assert lib.first() == 1

        def test_two():
            assert lib.second() == 2
        """
    )
    deps = recorded(pytester)
    assert functions(deps["test_a.py::test_one"]) == {"first", "<module>"}
    assert functions(deps["test_a.py::test_two"]) == {"second", "<module>"}


def test_a_test_that_replaces_the_trace_function_is_not_recorded_and_the_next_one_is(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_a="""
        import sys
        import lib

        def test_takes_the_hook():
            sys.settrace(lambda frame, event, arg: None)
            assert lib.first() == 1

        def test_after():
            assert lib.second() == 2
        """
    )
    deps = recorded(pytester)
    taker = deps["test_a.py::test_takes_the_hook"]
    assert taker["recorded"] is False
    assert taker["why"] == "something replaced devpool's trace function"
    assert deps["test_a.py::test_after"]["recorded"] is True
    assert "second" in functions(deps["test_a.py::test_after"])


def test_a_rerun_after_the_teardown_report_is_traced_too(pytester: pytest.Pytester) -> None:
    # pytest-rerunfailures runs the next attempt after the first one's teardown report, when
    # tracing is paused: the second attempt is traced as the first was.
    pytest.importorskip("pytest_rerunfailures")
    marker = Path(pytester.path / "attempted")
    pytester.makepyfile(
        test_a=f"""
        import os
        import lib

        def test_flaky():
            if not os.path.exists({str(marker)!r}):
                open({str(marker)!r}, "w").close()
                assert lib.first() == 2
            assert lib.second() == 2
        """
    )
    first, second = attempts(pytester, "--reruns", "1")
    assert "first" in functions(first) and first["recorded"]
    assert "second" in functions(second) and second["recorded"]
