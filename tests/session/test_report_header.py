"""session/header.report_header: devpool's lines in pytest's report header."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from devpool.config import Settings
from devpool.session.header import report_header


def _header(
    settings: Settings, devices: tuple[int, ...] = (0, 1), capture: str | None = "fd"
) -> list[str]:
    inventory: Any = SimpleNamespace(
        devices=devices, source="--devpool-devices", describe=lambda: "sim:0-1"
    )
    lock_dir: Any = SimpleNamespace(path=Path("/locks"))
    threads: Any = SimpleNamespace(header=lambda: ["devpool: threads: 4 per test", "devpool: w"])
    return report_header(settings, inventory, lock_dir, Path("/logs"), threads, 3, capture)


def test_the_header_names_devices_parallelism_folders_and_threads() -> None:
    lines = _header(Settings(devices=None, platforms={}, cpu_slots=5))
    assert lines == [
        "devpool: sim:0-1 from --devpool-devices; max-parallel 3, cpu slots 5",
        "devpool: lock dir /locks; logs /logs",
        "devpool: threads: 4 per test",
        "devpool: w",
    ]


def test_a_profile_note_says_where_its_settings_come_from() -> None:
    settings = Settings(
        devices=None, platforms={}, cpu_slots=2, profile_note="profile ci (CI=true)"
    )
    assert _header(settings)[-1] == "devpool: profile ci (CI=true)"


@pytest.mark.parametrize("capture", ["no", "tee-sys"])
def test_dash_s_says_where_tests_print(capture: str) -> None:
    lines = _header(Settings(devices=None, platforms={}, cpu_slots=2), capture=capture)
    assert lines[-1] == (
        "devpool: -s: tests print to their worker's log, not here: "
        "/logs/worker-N.log (each failure names its worker's log)"
    )


@pytest.mark.parametrize("capture", ["fd", "sys", None])
def test_captured_output_needs_no_line(capture: str | None) -> None:
    lines = _header(Settings(devices=None, platforms={}, cpu_slots=2), capture=capture)
    assert not any("-s:" in line for line in lines)


@pytest.mark.parametrize(("skip", "action"), [(False, "fail"), (True, "skip")])
def test_with_no_devices_the_first_line_says_what_device_tests_do(skip: bool, action: str) -> None:
    settings = Settings(devices=None, platforms={}, cpu_slots=2, skip_unsatisfiable=skip)
    lines = _header(settings, devices=())
    assert lines[0] == (
        f"devpool: --devpool-devices: CPU tests run, tests that need devices {action} as "
        "unsatisfiable; max-parallel 3, cpu slots 2"
    )
    assert lines[1] == "devpool: lock dir /locks; logs /logs"
