"""The first promise, on hand-picked suites: each one runs under plain pytest and under
devpool in the same test, and devpool's outcomes, counts and warnings must be pytest's.

(The generated suites are in test_oracle.py, the real projects in tests/conformance/.)
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from sessions import FAST, closing_line, events, junit_cases, run, text

# Plain pytest as a user has it with devpool installed: the plugin dormant (no --devices),
# so the markers are known and nothing else of devpool runs.
PLAIN = ("-p", "devpool.plugin", "-p", "no:cacheprovider")


@pytest.fixture(autouse=True)
def _only_named_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both sessions load the same plugins: pytest's own and devpool's."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)


def plain(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(*PLAIN, *args, timeout=120)


def counts(result: pytest.RunResult) -> str:
    """The closing line without its time: `90 failed, 210 passed, 1 warning`."""
    return re.sub(r" in [0-9.]+s.*$", "", closing_line(result).strip("= "))


def outcomes(xml: Path) -> dict[str, str]:
    """Each test's outcome as JUnit says it."""
    found = {}
    for case in junit_cases(xml):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        found[f"{case.get('classname')}::{case.get('name')}"] = ",".join(kinds) or "passed"
    return found


def workers(record: Path) -> set[int]:
    return {e["worker_pid"] for e in events(record, "job_start")}


def test_a_failing_suite_keeps_plain_pytests_outcomes_and_its_workers(
    pytester: pytest.Pytester, lock: Path
) -> None:
    body = "\n".join(
        f"def test_{i}():\n    assert {'False' if i % 10 < 3 else 'True'}\n" for i in range(300)
    )
    pytester.makepyfile(test_many=body)
    expected = plain(pytester, "--junitxml=plain.xml")

    result = run(
        pytester,
        lock,
        "--devices=sim:0-1",
        "--devpool-cpu-slots=2",
        "--junitxml=dev.xml",
        "--devpool-run-record=record.jsonl",
    )

    assert counts(result) == counts(expected) == "90 failed, 210 passed"
    assert result.ret == expected.ret == 1
    assert outcomes(pytester.path / "dev.xml") == outcomes(pytester.path / "plain.xml")
    assert not re.search(r"flaky|rerun|infra", closing_line(result), re.I)
    # An ordinary failure does not end its worker: a few workers ran all 300 tests.
    assert len(workers(pytester.path / "record.jsonl")) <= 4


def test_fresh_after_failure_gives_each_failure_a_new_process_and_the_same_outcomes(
    pytester: pytest.Pytester, lock: Path
) -> None:
    body = "\n".join(
        f"def test_{i}():\n    assert {'False' if i % 4 == 0 else 'True'}\n" for i in range(24)
    )
    pytester.makepyfile(test_some=body)
    expected = plain(pytester, "--junitxml=plain.xml")

    result = run(
        pytester,
        lock,
        "--devices=sim:0-1",
        "--devpool-fresh-after-failure",
        "--junitxml=dev.xml",
        "--devpool-run-record=record.jsonl",
    )

    assert counts(result) == counts(expected) == "6 failed, 18 passed"
    assert outcomes(pytester.path / "dev.xml") == outcomes(pytester.path / "plain.xml")
    record = pytester.path / "record.jsonl"
    failing = {e["worker_pid"] for e in events(record, "job_end") if e["outcome"] == "failed"}
    assert len(failing) == 6  # no process ran two failing tests
    sent_back = [e for e in events(record, "attempt") if e["state"] == "queued" and "reason" in e]
    assert sent_back  # the rest of a failed batch went back, and was not an outcome
    assert not re.search(r"flaky|rerun|infra", closing_line(result), re.I)


def test_warnings_of_tests_reach_the_summary_as_in_plain_pytest(
    pytester: pytest.Pytester, lock: Path
) -> None:
    pytester.makepyfile(
        test_warns="""
        import warnings
        import pytest

        class ProjectWarning(UserWarning):
            pass

        def test_plain():
            warnings.warn("plain one")

        def test_deprecated():
            warnings.warn(DeprecationWarning("old"))

        @pytest.mark.parametrize("i", range(3))
        def test_own_category(i):
            warnings.warn(ProjectWarning(f"mine {i % 2}"))

        @pytest.fixture
        def noisy():
            warnings.warn(RuntimeWarning("in setup"))

        @pytest.mark.device_count(1)
        def test_in_setup(noisy):
            pass
        """
    )
    expected = plain(pytester)

    result = run(pytester, lock, "--devices=sim:0-1")

    assert counts(result) == counts(expected) == "6 passed, 6 warnings"

    def summary(res: pytest.RunResult) -> set[str]:
        out = res.stdout.str()
        part = out.split("warnings summary", 1)[1].split("-- Docs:", 1)[0]
        blocks = set()
        for block in part.split("\n\n"):
            lines = [line for line in block.splitlines() if line.strip() and "==" not in line]
            where = sorted(line for line in lines if not line.startswith(" "))  # run order
            blocks.add("\n".join([*where, *(line for line in lines if line.startswith(" "))]))
        return blocks - {""}

    assert summary(result) == summary(expected)


def test_a_parametrize_id_built_at_collection_runs_by_its_place(
    pytester: pytest.Pytester, lock: Path
) -> None:
    pytester.makepyfile(
        test_stamps="""
        import time
        import pytest

        @pytest.mark.parametrize("stamp", [time.time_ns(), 5])
        def test_stamp(stamp):
            assert stamp

        def test_other():
            pass
        """
    )
    expected = plain(pytester)

    for fork in ("--devpool-fork-server", "--devpool-no-fork-server"):
        result = run(pytester, lock, "--devices=sim:0-1", fork)

        assert counts(result) == counts(expected) == "3 passed", text(result)
        said = [line for line in result.outlines if "was collected as" in line]
        assert len(said) == 1, text(result)
        assert re.search(r"test_stamp\[\d+\] was collected as test_stamps.py::test_stamp", said[0])


def test_failed_subtests_fail_their_test_in_every_report(
    pytester: pytest.Pytester, lock: Path
) -> None:
    pytester.makepyfile(
        test_subs="""
        def test_sub(subtests):
            for i in range(3):
                with subtests.test("describe", n=i - 1, pair=(i, "x")):
                    assert i != 1

        def test_after():
            pass
        """
    )
    expected = plain(pytester, "-v", "--junitxml=plain.xml")

    result = run(pytester, lock, "--devices=sim:0-1", "-v", "--junitxml=dev.xml")

    assert counts(result) == counts(expected)
    assert outcomes(pytester.path / "dev.xml") == outcomes(pytester.path / "plain.xml")
    shown = sorted(
        re.sub(r"\s+\[\s*\d+%\]$", "", line.split(" ", 1)[1])
        for line in expected.outlines
        if "SUB" in line
    )
    assert shown  # e.g. SUBPASSED[describe] (n=-1, pair=(0, 'x'))
    for line in shown:
        assert any(line in got for got in result.outlines), line

    # Rerun and failing again: failed, never flaky (a subtest's pass is not the test's).
    again = run(pytester, lock, "--devices=sim:0-1", "--junitxml=again.xml", "--devpool-reruns=1")
    assert counts(again).startswith("2 failed, 1 passed"), text(again)
    assert outcomes(pytester.path / "again.xml") == outcomes(pytester.path / "plain.xml")
    assert "flaky" not in text(again).lower()


def test_devpool_leaves_nothing_a_test_can_see_under_warnings_as_errors(
    pytester: pytest.Pytester, lock: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeini(
        """
        [pytest]
        filterwarnings =
            error
        """
    )
    pytester.makepyfile(
        test_clean=textwrap.dedent(
            """
            import gc
            import pytest

            @pytest.fixture(scope="module")
            def shared():
                yield 1

            @pytest.mark.parametrize("i", range(6))
            def test_cpu(shared, i):
                gc.collect()  # an unclosed file of devpool's would warn here, an error

            @pytest.mark.device_count(1)
            def test_device(shared):
                gc.collect()
            """
        )
    )
    expected = plain(pytester)
    assert counts(expected) == "7 passed"
    for flags in (
        ("-W", "error"),
        ("-W", "error::ResourceWarning"),
    ):
        for mode in ("worker", "module", "job"):
            for fork in ("--devpool-fork-server", "--devpool-no-fork-server"):
                result = pytester.runpytest_subprocess(
                    *FAST,
                    *flags,
                    f"--devpool-lock-dir={lock}",
                    "--devices=sim:0-1",
                    f"--devpool-isolation={mode}",
                    fork,
                    timeout=120,
                )
                assert counts(result) == "7 passed", (flags, mode, fork, text(result))
    for name, value in (("PYTHONDEVMODE", "1"), ("PYTHONWARNINGS", "error")):  # -X dev, -W
        with monkeypatch.context() as env:
            env.setenv(name, value)
            for fork in ("--devpool-fork-server", "--devpool-no-fork-server"):
                result = run(pytester, lock, "--devices=sim:0-1", fork)
                assert counts(result) == "7 passed", (name, fork, text(result))
