"""devpool capacity counts resource-seconds per named host resource, read as a run reads them."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from devpool.capacity.report import CollectedTest, collect_suite, render_json, render_text
from devpool.capacity.report import report as capacity_report


def test_resource_seconds_count_units_times_seconds_of_what_runs() -> None:
    tests = [
        CollectedTest("t::a", 0, 1, None, False, False, resources=(("hccl", 1),)),
        CollectedTest("t::b", 2, 1, None, False, False, resources=(("hccl", 1), ("lic", 2))),
        CollectedTest("t::c", 1, 1, None, False, True, resources=(("hccl", 1),)),  # disabled
    ]
    rep = capacity_report(tests, "sim", None, {"t::a": 3.0, "t::b": 5.0}, 1.0)
    assert rep.resource_seconds == {"hccl": 8.0, "lic": 10.0}
    assert "resource-seconds (units × seconds): hccl 8.00 s, lic 10.0 s" in render_text(rep)
    assert json.loads(render_json(rep))["resource_seconds"] == {"hccl": 8.0, "lic": 10.0}


def test_collection_reads_the_declared_resources(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(pytester.path)
    Path("pyproject.toml").write_text("[tool.devpool.resources]\nhccl = 1\n")
    Path("test_r.py").write_text(
        textwrap.dedent(
            """
            import pytest

            @pytest.mark.resources(hccl=1)
            def test_ring():
                pass
            """
        )
    )
    seen = collect_suite(["test_r.py", "-p", "no:hypothesispytest", "-p", "no:randomly"])
    assert seen.error is None
    assert [t.resources for t in seen.tests] == [(("hccl", 1),)]
