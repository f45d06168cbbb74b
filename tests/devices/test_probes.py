"""Device health probes and fatal error patterns: never stall, never guess.

The vendor tools are replaced by small scripts on PATH: one that is missing, one that
hangs, one that prints canned output. NVML is made unimportable so the command is used.
"""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

import pytest

from devpool.devices import probes
from devpool.devices.probes import FatalPatterns, ForeignProcess
from devpool.errors import DevpoolError

VENDOR_PROBES = [
    pytest.param(probes.nvidia_probe, "nvidia-smi", id="nvidia"),
    pytest.param(probes.ascend_probe, "npu-smi", id="ascend"),
    pytest.param(probes.rocm_probe, "rocm-smi", id="rocm"),
]


@pytest.fixture(autouse=True)
def _no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    # An installed nvidia-ml-py would answer before the command is tried.
    monkeypatch.setitem(sys.modules, "pynvml", None)


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty folder that is all of PATH (plus /bin for the scripts' shell and sleep)."""
    path = tmp_path / "bin"
    path.mkdir()
    monkeypatch.setenv("PATH", f"{path}:/bin:/usr/bin")
    return path


def fake_tool(bin_dir: Path, name: str, body: str) -> None:
    script = bin_dir / name
    script.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    script.chmod(0o755)


# ---- vendor probes: missing, hanging, canned output -----------------------------------


@pytest.mark.parametrize(("probe", "tool"), VENDOR_PROBES)
def test_missing_tool_is_unknown(probe: probes.Probe, tool: str, bin_dir: Path) -> None:
    import shutil

    assert shutil.which(tool) is None
    assert probe([0, 1]) is None


@pytest.mark.parametrize(("probe", "tool"), VENDOR_PROBES)
def test_hanging_tool_times_out_to_unknown(probe: object, tool: str, bin_dir: Path) -> None:
    # Not `exec`: the shell keeps a child that holds the output pipe, like a real hung tool.
    fake_tool(bin_dir, tool, "sleep 30\n")
    started = time.monotonic()
    assert probe([0, 1], timeout=0.5) is None  # type: ignore[operator]
    assert time.monotonic() - started < 5.0


@pytest.mark.parametrize(("probe", "tool"), VENDOR_PROBES)
def test_failing_tool_is_unknown(probe: probes.Probe, tool: str, bin_dir: Path) -> None:
    fake_tool(bin_dir, tool, "echo 'driver not loaded' >&2\nexit 9\n")
    assert probe([0]) is None


def test_nvidia_smi_output_maps_processes_to_gpus(bin_dir: Path) -> None:
    fake_tool(
        bin_dir,
        "nvidia-smi",
        """\
        case "$1" in
          --query-gpu=*)
            echo "0, 00000000:17:00.0"
            echo "1, 00000000:65:00.0"
            echo "2, 00000000:CA:00.0"
            echo "3, 00000000:E3:00.0"
            ;;
          --query-compute-apps=*)
            echo "00000000:65:00.0, 999991, python"
            echo "00000000:ca:00.0, 999992, /usr/bin/train"
            echo "00000000:65:00.0, 999993, other"
            echo "00000000:E3:00.0, 999994, not-asked-about"
            echo "garbage line"
            ;;
          *) exit 2 ;;
        esac
        """,
    )
    busy = probes.nvidia_probe([0, 1, 2])
    assert busy is not None
    seen = {device: [(p.pid, p.name) for p in procs] for device, procs in busy.items()}
    assert seen == {
        0: [],
        1: [(999991, "python"), (999993, "other")],
        2: [(999992, "/usr/bin/train")],
    }


def test_nvidia_smi_without_compute_apps_answer_is_unknown(bin_dir: Path) -> None:
    fake_tool(
        bin_dir,
        "nvidia-smi",
        """\
        case "$1" in
          --query-gpu=*) echo "0, 00000000:17:00.0" ;;
          *) exit 6 ;;
        esac
        """,
    )
    assert probes.nvidia_probe([0]) is None


def test_npu_smi_process_table(bin_dir: Path) -> None:
    fake_tool(
        bin_dir,
        "npu-smi",
        """\
        cat <<'EOF'
        +---------------------------+---------------+-------------------------------------+
        | NPU     Chip              | Process id    | Process name             | Memory   |
        +===========================+===============+=====================================+
        | 0       0                 | 999981        | python3                  | 3000     |
        | 3       0                 | 999982        | train.py                 | 100      |
        | 7       0                 | 999983        | elsewhere                | 100      |
        +===========================+===============+=====================================+
        EOF
        """,
    )
    busy = probes.ascend_probe([0, 1, 3])
    assert busy is not None
    seen = {device: [(p.pid, p.name) for p in procs] for device, procs in busy.items()}
    assert seen == {0: [(999981, "python3")], 1: [], 3: [(999982, "train.py")]}


def test_probe_for_picks_by_kind() -> None:
    assert probes.probe_for("cuda", {}) is probes.nvidia_probe
    assert probes.probe_for("ascend", {}) is probes.ascend_probe
    assert probes.probe_for("rocm", {}) is probes.rocm_probe


# ---- the sim fake -----------------------------------------------------------------------


def test_sim_probe_without_a_file_sees_nothing() -> None:
    assert probes.sim_probe([0, 1], None) == {0: [], 1: []}


def test_sim_probe_missing_file_sees_nothing(tmp_path: Path) -> None:
    assert probes.sim_probe([0, 1], tmp_path / "absent.json") == {0: [], 1: []}


@pytest.mark.parametrize("text", ["{not json", "", "\x00\x01"])
def test_sim_probe_garbage_file_is_unknown(tmp_path: Path, text: str) -> None:
    path = tmp_path / "busy.json"
    path.write_text(text)
    assert probes.sim_probe([0, 1], path) is None


def test_sim_probe_good_file(tmp_path: Path) -> None:
    path = tmp_path / "busy.json"
    path.write_text(
        json.dumps(
            {
                "2": [{"pid": 4242, "user": "ci2"}],
                "3": [{"pid": 7, "user": "bob", "name": "train"}, "not a table"],
                "9": [{"pid": 1}],  # not asked about
                "x": [{"pid": 1}],
            }
        )
    )
    busy = probes.sim_probe([0, 2, 3], path)
    assert busy == {
        0: [],
        2: [ForeignProcess(4242, "ci2")],
        3: [ForeignProcess(7, "bob", "train")],
    }


def test_sim_probe_for_reads_the_env_file_each_time(tmp_path: Path) -> None:
    path = tmp_path / "busy.json"
    probe = probes.probe_for("sim", {"DEVPOOL_SIM_BUSY": str(path)})
    assert probe([2]) == {2: []}
    path.write_text(json.dumps({"2": [{"pid": 4242, "user": "ci2"}]}))
    assert probe([2]) == {2: [ForeignProcess(4242, "ci2")]}
    assert probes.probe_for("sim", {})([2]) == {2: []}


def test_foreign_and_describe_busy() -> None:
    busy = {2: [ForeignProcess(4242, "ci2"), ForeignProcess(100, "me")], 3: [ForeignProcess(100)]}
    theirs = probes.foreign(busy, ours=[100])
    assert theirs == {2: [ForeignProcess(4242, "ci2")], 3: []}
    assert probes.describe_busy("sim", theirs) == "device sim:2 busy: pid 4242 (user ci2)"
    named = {5: [ForeignProcess(1, "a", "python")]}
    assert probes.describe_busy("cuda", named) == "device cuda:5 busy: pid 1 (user a, python)"


# ---- fatal patterns -----------------------------------------------------------------------


def test_fatal_pattern_defaults() -> None:
    sim = FatalPatterns.for_platform("sim", "sim", None)
    assert sim.find("boom\nDEVPOOL-SIM-FATAL: device lost\n") == "DEVPOOL-SIM-FATAL"
    assert sim.find("AssertionError: 1 != 2") is None
    cuda = FatalPatterns.for_platform("cuda", "cuda", {})
    assert cuda.find("RuntimeError: CUDA error: an illegal memory access was encountered")
    assert cuda.find("NVRM: Xid (PCI:0000:17:00): 79, GPU has fallen off the bus")
    assert cuda.find("Xidney") is None
    ascend = FatalPatterns.for_platform("a2a3", "ascend", None)
    assert ascend.find("EZ9999: error code 507018") == "507018"
    assert ascend.find("code 5070189") is None


def test_fatal_pattern_table_replaces_defaults() -> None:
    table = {"sim": [r"card \d+ melted"]}
    fatal = FatalPatterns.for_platform("sim", "sim", table)
    assert fatal.find("oh no: card 5 melted") == "card 5 melted"
    assert fatal.find("DEVPOOL-SIM-FATAL") is None


def test_fatal_pattern_table_by_name_before_kind() -> None:
    table = {"a2a3sim": ["by-name"], "sim": ["by-kind"]}
    fatal = FatalPatterns.for_platform("a2a3sim", "sim", table)
    assert fatal.find("by-name") and not fatal.find("by-kind")
    # Another platform of the same kind falls back to the kind's entry.
    other = FatalPatterns.for_platform("other", "sim", table)
    assert other.find("by-kind") and not other.find("by-name")


def test_fatal_pattern_empty_list_turns_it_off() -> None:
    fatal = FatalPatterns.for_platform("sim", "sim", {"sim": []})
    assert fatal.find("DEVPOOL-SIM-FATAL") is None


def test_bad_fatal_regex_is_one_sentence() -> None:
    with pytest.raises(DevpoolError) as info:
        FatalPatterns.for_platform("sim", "sim", {"sim": ["ok", "([unclosed"]})
    text = str(info.value)
    assert "[tool.devpool.fatal-patterns] sim" in text
    assert "'([unclosed'" in text and "not a regular expression" in text
    assert "\n" not in text


@pytest.mark.parametrize("value", ["DEVPOOL-SIM-FATAL", [1, 2], {"device": "melted"}])
def test_fatal_patterns_must_be_a_list_of_strings(value: object) -> None:
    with pytest.raises(DevpoolError, match=r"fatal-patterns\] sim must be a list"):
        FatalPatterns.for_platform("sim", "sim", {"sim": value})
