"""Unit tests of `devpool capacity --suggest-memory` (memory_suggest.py): rounding and tables."""

from __future__ import annotations

import json

import pytest

from devpool.capacity.memory_suggest import (
    GiB,
    MiB,
    render_json,
    render_markdown,
    render_text,
    size_text,
    suggest,
    suggested_size,
)
from devpool.capacity.report import CollectedTest
from devpool.devices.sizes import parse_size


def collected(
    nodeid: str, devices: int = 1, memory: int | None = None, **kw: object
) -> CollectedTest:
    fields: dict[str, object] = {"platforms": None, "quarantined": False, "disabled": False}
    fields.update(kw)
    return CollectedTest(nodeid, devices, 1, device_memory=memory, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("peak", "size", "text"),
    [
        (1, 256 * MiB, "256MiB"),
        (100 * MiB, 256 * MiB, "256MiB"),  # 125 MiB → the next 256 MiB
        (205 * MiB, 512 * MiB, "512MiB"),  # 256.25 MiB → 512 MiB
        (820 * MiB, 1280 * MiB, "1.25GiB"),
        (3 * GiB, 3840 * MiB, "3.75GiB"),  # 3.75 GiB exactly
        (int(3.3 * GiB), 5 * GiB, "5GiB"),  # 4.125 GiB: from 4 GiB on, whole GiB
        (10 * GiB, 13 * GiB, "13GiB"),  # 12.5 GiB → 13 GiB
    ],
)
def test_peak_times_one_and_a_quarter_rounded_up(peak: int, size: int, text: str) -> None:
    assert suggested_size(peak) == size
    assert size >= peak * 1.25
    assert size_text(size) == text
    assert parse_size(text) == size  # the marker argument means exactly this size


def test_suggests_for_tests_with_peaks_and_counts_device_tests_without() -> None:
    tests = [
        collected("t.py::small", memory=2 * GiB),
        collected("t.py::whole"),  # a whole-device test is never watched: no peak
        collected("t.py::cpu", devices=0),  # a CPU test needs no device memory: not counted
        collected("t.py::off", disabled=True),
        collected("t.py::cuda_only", platforms=("cuda",)),
        collected("t.py::pair", devices=2, memory=8 * GiB),
    ]
    peaks = {"t.py::small": (4, 900 * MiB), "t.py::pair": (2, 6 * GiB), "gone.py::x": (1, GiB)}
    found = suggest(tests, peaks, "sim", "sim")
    assert [(s.nodeid, s.runs, s.peak, s.declared) for s in found.rows] == [
        ("t.py::pair", 2, 6 * GiB, 8 * GiB),
        ("t.py::small", 4, 900 * MiB, 2 * GiB),
    ]
    assert [s.marker for s in found.rows] == [
        '@pytest.mark.device_memory("8GiB")',
        '@pytest.mark.device_memory("1.25GiB")',
    ]
    assert found.without_peak == 1  # whole

    text = render_text(found)
    assert "peak × 1.25, rounded up to the next 256 MiB below 4 GiB" in text
    row = next(line for line in text.splitlines() if "t.py::small" in line).split()
    assert row[:6] == ["t.py::small", "4", "900", "MiB", "2", "GiB"]
    assert row[-1] == '@pytest.mark.device_memory("1.25GiB")'
    assert "1 device test has no recorded peak: a peak is recorded only for a test" in text
    assert "$DEVPOOL_SIM_MEMORY_FILE" in text

    data = json.loads(render_json(found))
    assert data["schema"] == "devpool-memory-suggestions/1"
    assert data["suggestions"][1] == {
        "nodeid": "t.py::small",
        "runs": 4,
        "peak_bytes": 900 * MiB,
        "declared_bytes": 2 * GiB,
        "suggested_bytes": 1280 * MiB,
        "suggested": "1.25GiB",
        "marker": '@pytest.mark.device_memory("1.25GiB")',
    }
    assert data["without_peak"] == 1
    assert "| `t.py::small` | 4 | 900 MiB | 2 GiB |" in render_markdown(found)


def test_no_peaks_at_all_says_so() -> None:
    found = suggest([collected("t.py::a"), collected("t.py::b")], {}, "sim")
    text = render_text(found)
    assert "no test has a recorded peak yet" in text
    assert "2 device tests have no recorded peak" in text
