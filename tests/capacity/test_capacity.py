"""Unit tests of the capacity report (capacity.py): collection, counts, costs, renderings."""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from devpool.capacity.report import (
    CAPACITY_SCHEMA,
    CollectedTest,
    apply_quarantine,
    collect,
    collect_suite,
    parse_runner_class,
    pool_sizes,
    render_json,
    render_markdown,
    render_text,
    report,
    simulate,
    size_label,
    to_json,
)
from devpool.errors import DevpoolError
from devpool.history.quarantine import Entry

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# Hand count of the markers in examples/ (read from the files, not from devpool):
#   test_cpu_utils.py    test_shape_math × 8 + test_cpu_tests_see_no_device    9 CPU-only
#   test_kernels.py      test_matmul: 4 dtypes × 3 sizes, device_count(1)      12 one-device
#   test_platforms.py    test_cuda_graphs_capture platforms([cuda]), 1 device  1 one-device (cuda)
#                        test_portable_kernel platforms([sim, cuda]), 1 device 1 one-device
#   test_collectives.py  test_allreduce_pair × 3 ops, device_count(2)          3 two-device
#                        test_allreduce_four × 2 algos, device_count(4)        2 four-device
#                        test_full_node_training_step, device_count(8)         1 eight-device
#   test_distributed.py  2 tests, ranks(2): a device per rank                 2 two-device
EXAMPLES_BY_SIZE = {"cpu": 9, "1": 14, "2": 5, "4": 2, "8": 1}
CUDA_ONLY = "examples/test_platforms.py::test_cuda_graphs_capture"


def collected(nodeid: str, devices: int = 1, **kw: object) -> CollectedTest:
    fields: dict[str, object] = {
        "nodes": 1,
        "platforms": None,
        "quarantined": False,
        "disabled": False,
    }
    fields.update(kw)
    return CollectedTest(nodeid, devices, **fields)  # type: ignore[arg-type]


@pytest.fixture
def examples(pytester: pytest.Pytester) -> list[CollectedTest]:
    # pytester restores sys.modules and sys.path afterwards: the examples' conftest and
    # test modules do not leak into this session.
    return collect([str(EXAMPLES), "-p", "no:hypothesispytest"])


def test_examples_counts_match_the_hand_count(examples: list[CollectedTest]) -> None:
    assert len(examples) == 31
    by_size = Counter(size_label(t.device_count, t.nodes) for t in examples)
    assert by_size == EXAMPLES_BY_SIZE
    rep = report(examples, "sim", None, {}, 1.0)
    rows = {r.label: r for r in rep.rows}
    assert {label: r.total for label, r in rows.items()} == EXAMPLES_BY_SIZE
    assert rows["1"].enabled == 13
    assert rows["1"].skipped_by_platform == 1
    assert rep.skipped_by_platform == [CUDA_ONLY]
    assert rep.totals.enabled == 30
    assert rep.totals.quarantined == rep.totals.disabled == 0
    # Default 1 s each: 13×1 + 5×2 + 2×4 + 1×8 device-seconds.
    assert rep.totals.device_seconds == pytest.approx(39.0)
    assert rows["cpu"].device_seconds == 0.0
    assert rep.cannot_run_anywhere == []


def test_examples_on_cuda_run_the_cuda_test(examples: list[CollectedTest]) -> None:
    rep = report(examples, "cuda", None, {}, 1.0)
    rows = {r.label: r for r in rep.rows}
    assert rows["1"].enabled == 14
    assert rep.totals.skipped_by_platform == 0


def test_platforms_marker_admits_a_kind(examples: list[CollectedTest]) -> None:
    # A project platform "a2a3" of kind cuda runs a platforms(["cuda"]) test, as a run does.
    rep = report(examples, "a2a3", None, {}, 1.0, kind="cuda")
    assert rep.skipped_by_platform == []
    rep = report(examples, "a2a3", None, {}, 1.0, kind="ascend")
    assert rep.totals.skipped_by_platform == 2


def test_examples_json_and_markdown(examples: list[CollectedTest]) -> None:
    rep = report(examples, "sim", {"sim-4": 4}, {}, 1.0, devices_per_runner=4, timeline=True)
    data = json.loads(render_json(rep))
    assert data["schema"] == CAPACITY_SCHEMA == "devpool-capacity/1"
    assert data["totals"]["tests"] == 31
    assert [r["label"] for r in data["rows"]] == ["cpu", "1", "2", "4", "8"]
    assert data["cannot_run_anywhere"][0]["nodeid"] == (
        "examples/test_collectives.py::test_full_node_training_step"
    )
    assert "largest runner class, sim-4, has 4" in data["cannot_run_anywhere"][0]["reason"]
    markdown = render_markdown(rep)
    assert "<details" in markdown and "</details>" in markdown
    assert "Cannot run anywhere: 1" in markdown
    assert "| devices | enabled |" in markdown
    text = render_text(rep)
    assert "cannot run anywhere: 1" in text
    assert "timeline" in text


def test_states_are_exclusive_and_costs_count_what_runs() -> None:
    tests = [
        collected("t.py::on", 2),
        collected("t.py::q", 2, quarantined=True),
        collected("t.py::off", 2, disabled=True),
        collected("t.py::elsewhere", 2, platforms=("cuda",), disabled=True),
    ]
    rep = report(tests, "sim", None, {"t.py::on": 10.0}, 1.0, devices_per_runner=4)
    (row,) = rep.rows
    assert (row.enabled, row.quarantined, row.disabled, row.skipped_by_platform) == (1, 1, 1, 1)
    assert row.device_seconds == pytest.approx(2 * 10.0 + 2 * 1.0)
    assert row.wall == pytest.approx(10.0)  # the longest test beats 22 / 4
    assert (rep.from_history, rep.at_default) == (1, 1)


def test_multi_node_rows_and_labels() -> None:
    assert size_label(0) == "cpu"
    assert size_label(4) == "4"
    assert size_label(4, 2) == "2 nodes × 4"
    tests = [collected("a", 4, nodes=2), collected("b", 1), collected("c", 0)]
    rep = report(tests, "cuda", None, {}, 2.0)
    assert [r.label for r in rep.rows] == ["cpu", "1", "2 nodes × 4"]
    assert rep.rows[2].device_seconds == pytest.approx(16.0)


def test_cannot_run_anywhere_uses_the_largest_runner_class() -> None:
    tests = [collected("t.py::big", 16), collected("t.py::mid", 8), collected("t.py::small", 1)]
    rep = report(tests, "cuda", {"cuda-8": 8, "cuda-2": 2}, {}, 1.0)
    assert [u.nodeid for u in rep.cannot_run_anywhere] == ["t.py::big"]
    assert rep.cannot_run_anywhere[0].reason == (
        "needs 16 cuda devices per node; the largest runner class, cuda-8, has 8"
    )


def test_parse_runner_class() -> None:
    assert parse_runner_class("sim-8=8") == ("sim-8", 8)
    for bad in ("sim-8", "=8", "x=0", "x=eight"):
        with pytest.raises(DevpoolError, match="is not NAME=DEVICES"):
            parse_runner_class(bad)


def test_drift_lists_worst_first_beyond_the_factor() -> None:
    tests = [collected("a"), collected("b"), collected("c"), collected("d")]
    latest = {"a": 9.0, "b": 1.0, "c": 2.5, "d": 1.0}
    previous = {"a": 1.0, "b": 4.0, "c": 2.0}
    rep = report(tests, "sim", None, latest, 1.0, previous=previous, drift_factor=2.0)
    assert [(d.nodeid, d.factor) for d in rep.drift] == [("a", 9.0), ("b", 4.0)]
    assert to_json(rep)["drift"][0] == {
        "nodeid": "a",
        "previous": 1.0,
        "latest": 9.0,
        "factor": 9.0,
    }
    assert "drift (p90 moved more than 2x): 2" in render_text(rep)


def test_drift_leaves_out_tests_under_50_ms_both_times() -> None:
    """A 44x jump from 0.001 s to 0.044 s is the clock's noise; 0.01 s to 0.5 s is not."""
    tests = [collected("noise"), collected("real")]
    latest = {"noise": 0.044, "real": 0.5}
    previous = {"noise": 0.001, "real": 0.01}
    rep = report(tests, "sim", None, latest, 1.0, previous=previous, drift_factor=2.0)
    assert [d.nodeid for d in rep.drift] == ["real"]


def test_timeline_simulates_devpools_scheduler() -> None:
    assert pool_sizes(8) == [1, 2, 4, 8]
    assert pool_sizes(6) == [1, 2, 4, 6]
    assert pool_sizes(1) == [1]
    assert simulate([(1, 1.0)] * 8, 8) == pytest.approx(1.0)
    assert simulate([(1, 1.0)] * 8, 1) == pytest.approx(8.0)
    assert simulate([(8, 5.0), (1, 1.0), (1, 1.0)], 8) == pytest.approx(6.0)
    tests = [collected(f"t{i}", 1) for i in range(8)] + [collected("big", 8)]
    rep = report(tests, "sim", None, {}, 1.0, timeline=True)
    assert rep.timeline is not None
    by_pool = {t.devices: t for t in rep.timeline}
    assert by_pool[1].too_big == 1 and by_pool[1].makespan == pytest.approx(8.0)
    assert by_pool[8].too_big == 0 and by_pool[8].makespan == pytest.approx(2.0)


def test_collect_reads_skip_quarantine_and_platform_markers(pytester: pytest.Pytester) -> None:
    pytester.makepyprojecttoml(
        """
        [tool.devpool.platforms]
        a2a3sim = "sim"
        [tool.devpool.quarantine."test_suite.py::test_listed"]
        reason = "flaky on sim"
        platforms = ["sim"]
        """
    )
    pytester.makepyfile(
        test_suite=textwrap.dedent(
            """
            import sys
            import pytest

            @pytest.mark.skipif(sys.version_info > (3,), reason="always")
            def test_skipif_true(): pass

            @pytest.mark.skipif(sys.version_info < (3,), reason="never")
            def test_skipif_false(): pass

            @pytest.mark.skip(reason="off")
            @pytest.mark.device_count(2)
            def test_skipped(): pass

            @pytest.mark.quarantine(reason="broken", owner="me", until="2099-01-01")
            def test_quarantined(): pass

            def test_listed(): pass

            @pytest.mark.platforms(["a2a3sim"])
            @pytest.mark.nodes(2)
            @pytest.mark.device_count(4)
            def test_multi(): pass
            """
        )
    )
    seen = collect_suite([str(pytester.path), "-p", "no:hypothesispytest"])
    tests = {t.nodeid.split("::")[1]: t for t in seen.tests}
    assert tests["test_skipif_true"].disabled
    assert not tests["test_skipif_false"].disabled
    assert tests["test_skipped"].disabled and tests["test_skipped"].device_count == 2
    assert tests["test_quarantined"].quarantined
    assert tests["test_multi"].platforms == ("a2a3sim",)
    assert (tests["test_multi"].nodes, tests["test_multi"].device_count) == (2, 4)
    assert "a2a3sim" in seen.platforms
    apply_quarantine(seen.tests, seen.quarantine, "cuda", "cuda")
    assert not tests["test_listed"].quarantined  # the entry is scoped to sim
    apply_quarantine(seen.tests, seen.quarantine, "sim", "sim")
    assert tests["test_listed"].quarantined
    assert seen.quarantine == [
        Entry(
            "test_suite.py::test_listed",
            "flaky on sim",
            platforms=("sim",),
            source=seen.quarantine[0].source,
        )
    ]


def test_collect_respects_keyword_selection(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_k="def test_a(): pass\ndef test_b(): pass\n")
    tests = collect([str(pytester.path), "-k", "test_a", "-p", "no:hypothesispytest"])
    assert [t.nodeid for t in tests] == ["test_k.py::test_a"]


def test_bad_marker_names_the_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_bad="import pytest\n@pytest.mark.device_count('two')\ndef test_x(): pass\n"
    )
    with pytest.raises(DevpoolError, match=r"test_bad.py::test_x: @pytest.mark.device_count"):
        collect([str(pytester.path), "-p", "no:hypothesispytest"])


def test_collection_error_is_one_sentence(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_broken="def test_x(:\n")
    with pytest.raises(DevpoolError) as info:
        collect([str(pytester.path), "-p", "no:hypothesispytest"])
    message = str(info.value)
    assert message.startswith("pytest could not collect")
    assert "test_broken.py" in message
    assert "\n" not in message


def test_empty_suite_is_no_error(pytester: pytest.Pytester) -> None:
    assert collect([str(pytester.path), "-p", "no:hypothesispytest"]) == []
