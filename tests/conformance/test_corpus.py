"""Conformance: the ci = true projects of manifest.toml, plain pytest against devpool.

Select with `python -m pytest tests/conformance` or `-k conformance`. Each case downloads (once,
cached) a real project's sdist, runs its suite in plain pytest and under devpool
(--devices sim:0-1) and asserts that every test's outcome and the closing line's counts agree.
Without the package index the cases skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest


def _load_corpus():
    name = "devpool_conformance_corpus"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("corpus.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


corpus = _load_corpus()
CI_PROJECTS = [p for p in corpus.load_manifest() if p.ci]


@pytest.mark.parametrize("mutated", [False, True], ids=["unchanged", "mutated"])
@pytest.mark.parametrize("project", CI_PROJECTS, ids=[p.name for p in CI_PROJECTS])
def test_conformance(project, mutated: bool) -> None:
    try:
        result = corpus.check_project(project, mutated, log=lambda *a, **k: None)
    except corpus.IndexUnreachable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and the package index cannot be reached: {exc}")
        pytest.skip(f"the package index cannot be reached: {exc}")
    if mutated:
        broken = (result.plain.counts or {}).get("failed", 0)
        assert broken, f"the mutation broke no test of {project.pin}:\n{result.report()}"
    assert result.ok, "\n" + result.report()


def test_conformance_manifest_is_complete() -> None:
    projects = corpus.load_manifest()
    assert len(projects) >= 5
    assert 2 <= len(CI_PROJECTS) <= 3
    for p in projects:
        assert len(p.sha256) == 64 and p.mutation.old and p.mutation.old != p.mutation.new
        assert all("==" in dep for dep in p.deps), f"{p.name}: unpinned deps {p.deps}"


def test_conformance_closing_line_and_junit(tmp_path: Path) -> None:
    """The comparison itself, on made-up runs: counts, outcome sets, absent tests."""
    out = "x\n==== 3 passed, 1 failed, 2 errors, 1 warning in 0.50s (0:00:00) ====\ndevpool: bye\n"
    counts, line = corpus.parse_closing_line(out)
    assert counts == {"passed": 3, "failed": 1, "errors": 2, "warnings": 1}
    assert line == "3 passed, 1 failed, 2 errors, 1 warning in 0.50s (0:00:00)"
    assert corpus.parse_closing_line("1 passed, 1 xfailed in 2.00s") == (
        {"passed": 1, "xfailed": 1},
        "1 passed, 1 xfailed in 2.00s",
    )
    junit = tmp_path / "a.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="t" name="ok"/>'
        '<testcase classname="t" name="bad"><failure message="boom"/><error message="td"/>'
        "</testcase>"
        '<testcase classname="t" name="xf"><skipped type="pytest.xfail" message="r"/></testcase>'
        '<testcase classname="t" name="sk"><skipped type="pytest.skip" message="r"/></testcase>'
        "</testsuite></testsuites>"
    )
    cases = corpus.parse_junit(junit)
    assert {k[1]: [c.outcome for c in v] for k, v in cases.items()} == {
        "ok": ["passed"],
        "bad": ["error+failed"],
        "xf": ["xfailed"],
        "sk": ["skipped"],
    }
    project = corpus.load_manifest()[0]
    plain = corpus.Run("plain", [], 1, 1.0, out, counts, line, cases)
    other = dict(cases)
    other[("t", "ok")] = [corpus.Case("error", "DeprecationWarning")]
    del other[("t", "sk")]
    dev_counts = dict(counts, passed=2, errors=3)
    dev = corpus.Run("devpool", [], 1, 1.0, out, dev_counts, line, other)
    result = corpus.compare(project, False, plain, dev)
    assert not result.ok
    assert ("t::ok", "passed", "error") in result.per_test
    assert ("t::sk", "skipped", "(absent)") in result.per_test
    assert "closing line 'passed': plain 3, devpool 2" in result.differences
    assert "DeprecationWarning" in result.report()
    assert corpus.compare(project, False, plain, plain).ok
