"""The worker-side recorder (select/record.py) in a real pytest session, without devpool's
controller: what each test's teardown report carries, with each watch (select/watch.py)
this interpreter has, now that reports and the time between tests run unwatched."""

from __future__ import annotations

import json
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from devpool.select import watch
from devpool.select.baseline import Builder
from devpool.select.tables import expand

PLUGIN = """
    import json, os
    import pytest
    from devpool.select import watch
    from devpool.select.record import DEPS_ATTR, Recorder

    WATCHES = {
        "monitoring": lambda recorder: watch.Monitor(4, recorder._watched),
        "native": lambda recorder: watch.NativeHook(),
        "profiler": lambda recorder: watch.Profiler(),
        "trace": lambda recorder: watch.Tracer(),
    }

    def pytest_configure(config):
        recorder = Recorder(config.rootpath)
        recorder.watch = WATCHES[os.environ["WATCH"]](recorder)
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


    def helper():
        return 4
    """

# The watches this interpreter has: sys.monitoring from 3.12 on; devpool's frame hook on
# 3.11 where it was built; cProfile's hook before 3.12; a trace function everywhere.
WATCHES = [
    *(["monitoring"] if sys.version_info >= (3, 12) else []),
    *(["native"] if watch._calls is not None else []),
    *(["profiler"] if sys.version_info < (3, 12) else []),
    "trace",
]

# How a test takes each watch's hook from devpool.
TAKE_HOOK = {
    "monitoring": "sys.monitoring.free_tool_id(4)",
    "native": "torch_compile_like()",
    "profiler": "sys.setprofile(lambda frame, event, arg: None)",
    "trace": "sys.settrace(lambda frame, event, arg: None)",
}
WHY = {
    "monitoring": "something freed devpool's sys.monitoring tool id",
    "native": "something replaced devpool's frame-evaluation hook (torch.compile does)",
    "profiler": "something replaced devpool's profiler",
    "trace": "something replaced devpool's trace function",
}


@pytest.fixture(params=WATCHES)
def which(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("WATCH", request.param)
    return str(request.param)


def test_this_interpreter_gets_its_cheapest_watch() -> None:
    chosen = watch.watch_for_this_interpreter(lambda filename: False)
    expected = {"monitoring": watch.Monitor, "native": watch.NativeHook}.get(WATCHES[0])
    assert type(chosen) is (expected or watch.Profiler)
    if sys.version_info[:2] == (3, 11):  # the frame hook is built here (setup.py)
        assert type(chosen) is watch.NativeHook
    if isinstance(chosen, watch.Monitor):
        sys.monitoring.free_tool_id(chosen.tool)
    elif isinstance(chosen, watch.Profiler):  # it set a profile function for new threads
        threading.setprofile(None)  # type: ignore[arg-type]


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
        result = pytester.runpytest_subprocess("-p", "recording_plugin", "-p", "no:devpool", *args)
    assert out.exists(), result.stdout.str() + result.stderr.str()
    # In order: a worker's shared tables travel with the first report that names them;
    # the controller's Builder turns spots into blocks.
    builder = Builder(pytester.path)
    return [builder._blocks(expand(json.loads(line))) for line in out.read_text().splitlines()]


def functions(deps: dict[str, Any], file: str = "lib.py") -> set[str]:
    return {key.split("::", 1)[1] for key in deps.get("blocks", {}) if key.startswith(file)}


def test_what_runs_between_tests_and_in_report_hooks_is_nobody_s(
    pytester: pytest.Pytester, which: str
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


def test_a_test_that_takes_the_hook_is_not_recorded_and_the_next_one_is(
    pytester: pytest.Pytester, which: str
) -> None:
    pytester.makepyfile(
        test_a=f"""
        import sys
        import lib

        def torch_compile_like():
            # torch.compile sets its own frame-evaluation hook and then puts back none.
            from devpool.select import _calls
            _calls.disable()

        def test_takes_the_hook():
            {TAKE_HOOK[which]}
            assert lib.first() == 1

        def test_after():
            assert lib.second() == 2
        """
    )
    deps = recorded(pytester)
    taker = deps["test_a.py::test_takes_the_hook"]
    assert taker["recorded"] is False
    assert taker["why"] == WHY[which]
    assert deps["test_a.py::test_after"]["recorded"] is True
    assert "second" in functions(deps["test_a.py::test_after"])


def test_a_rerun_after_the_teardown_report_is_traced_too(
    pytester: pytest.Pytester, which: str
) -> None:
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


def test_an_import_inside_a_test_counts_for_every_later_test(
    pytester: pytest.Pytester, which: str
) -> None:
    # helper() runs in the test before the import and again while the import runs: the
    # second run is the import's, so every later test depends on it (a watch that sees
    # each function once per test must see it again when an import starts).
    pytester.makepyfile(
        late="""
        import lib

        VALUE = lib.helper()
        """,
        test_a="""
        import lib

        def test_imports():
            assert lib.helper() == 4
            import late
            assert late.VALUE == 4

        def test_later():
            assert lib.first() == 1

        def test_raising_import():
            import lib
            try:
                import broken
            except ZeroDivisionError:
                pass
            assert lib.second() == 2
        """,
        broken="""
        import lib

        lib.between()
        1 / 0
        """,
    )
    deps = recorded(pytester)
    importing = deps["test_a.py::test_imports"]
    assert {"helper", "<module>"} <= functions(importing)
    assert functions(importing, "late.py") == {"<module>"}
    later = deps["test_a.py::test_later"]
    assert functions(later) >= {"first", "helper"}
    assert functions(later, "late.py") == {"<module>"}
    # An import that raised ends too: second() after it is the test's own.
    raising = deps["test_a.py::test_raising_import"]
    assert {"second", "between"} <= functions(raising)
    assert "second" not in functions(later)


def test_code_run_in_a_thread_counts_for_its_test(pytester: pytest.Pytester, which: str) -> None:
    pytester.makepyfile(
        test_a="""
        import threading
        import lib

        def test_thread():
            thread = threading.Thread(target=lib.first)
            thread.start()
            thread.join()

        def test_other():
            assert lib.second() == 2
        """
    )
    deps = recorded(pytester)
    assert "first" in functions(deps["test_a.py::test_thread"])
    assert "first" not in functions(deps["test_a.py::test_other"])


def test_a_shared_fixture_keeps_what_it_ran_for_every_test_that_uses_it(
    pytester: pytest.Pytester, which: str
) -> None:
    # The module-scoped fixture runs helper() after test_first's function-scoped fixture
    # already ran it: the fixture's own record must still hold it for test_second.
    pytester.makepyfile(
        test_a="""
        import pytest
        import lib

        @pytest.fixture
        def early():
            return lib.helper()

        @pytest.fixture(scope="module")
        def shared():
            return lib.helper() + lib.between()

        def test_first(early, shared):
            assert shared == 7

        def test_second(shared):
            assert lib.first() == 1
        """
    )
    deps = recorded(pytester)
    assert {"helper", "between"} <= functions(deps["test_a.py::test_first"])
    assert {"helper", "between", "first"} <= functions(deps["test_a.py::test_second"])
