"""Unit tests for devpool.devices.inventory: specs, platforms config, narrowing and detection."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from devpool.devices import inventory
from devpool.devices.detection import rocm
from devpool.devices.inventory import (
    BUILTIN_PLATFORMS,
    KINDS,
    Inventory,
    Platform,
    detect,
    format_ids,
    load_platforms,
    parse_ids,
    resolve_inventory,
)
from devpool.errors import DevpoolError

CUDA = BUILTIN_PLATFORMS["cuda"]
# Found before tests narrow PATH to a folder of fake tools.
SLEEP = shutil.which("sleep") or "/bin/sleep"
PLATFORMS = load_platforms({"a2a3": "ascend", "a2a3sim": "sim"})


def fixed(ids: list[int] | None) -> Callable[[], list[int] | None]:
    return lambda: ids


def detectors(
    cuda: list[int] | None = None,
    ascend: list[int] | None = None,
    rocm: list[int] | None = None,
) -> dict[str, Callable[[], list[int] | None]]:
    return {"cuda": fixed(cuda), "ascend": fixed(ascend), "rocm": fixed(rocm)}


# A host where every platform's probe sees 8 devices.
HARDWARE = detectors(list(range(8)), list(range(8)), list(range(8)))


def fake_tool(folder: Path, name: str, script: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@pytest.fixture
def no_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes `import pynvml` raise ImportError, whether or not it is installed.
    monkeypatch.setitem(sys.modules, "pynvml", None)


@pytest.fixture
def tool_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", str(folder))
    return folder


# --- parse_ids -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", [0]),
        ("0-3", [0, 1, 2, 3]),
        ("0-3,5,7", [0, 1, 2, 3, 5, 7]),
        ("7,5,0-1", [0, 1, 5, 7]),
        ("2-2", [2]),
        (" 0 , 2 ", [0, 2]),
        ("10-12", [10, 11, 12]),
    ],
)
def test_parse_ids_accepts(text: str, expected: list[int]) -> None:
    assert parse_ids(text) == expected


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("", "empty"),
        ("  ", "empty"),
        ("0,,1", "empty part"),
        ("a", "'a'"),
        ("1.5", "'1.5'"),
        ("0-x", "'0-x'"),
        ("-1", "'-1' is negative"),
        ("5-2", "'5-2' runs backwards"),
        ("0-3,2", "'2' repeats 2"),
        ("1,1", "'1' repeats 1"),
        ("0-2,1-4", "'1-4' repeats 1,2"),
        ("0-99999999", "above"),
    ],
)
def test_parse_ids_rejects_naming_the_part(text: str, named: str) -> None:
    with pytest.raises(DevpoolError, match="device ids") as error:
        parse_ids(text)
    assert named in str(error.value)


# --- describe ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "ids", "expected"),
    [
        ("sim", range(8), "sim:0-7 (8 devices)"),
        ("cuda", [0, 2, 5], "cuda:0,2,5 (3 devices)"),
        ("cuda", [0, 1, 2, 3, 6, 7, 9], "cuda:0-3,6,7,9 (7 devices)"),
        ("cuda", [4], "cuda:4 (1 device)"),
        ("cuda", [0, 1, 2, 4, 5, 6], "cuda:0-2,4-6 (6 devices)"),
    ],
)
def test_describe_compresses_runs(name: str, ids: range | list[int], expected: str) -> None:
    inv = Inventory(PLATFORMS[name], tuple(ids), "test")
    assert inv.describe() == expected


def test_format_ids_round_trips_through_parse_ids() -> None:
    ids = [0, 1, 2, 3, 5, 8, 9, 11, 12, 13]
    assert parse_ids(format_ids(ids)) == ids


# --- load_platforms ------------------------------------------------------------------------


def test_builtins_have_documented_variables_and_resources() -> None:
    assert load_platforms(None) == BUILTIN_PLATFORMS
    assert {name: p.kind for name, p in BUILTIN_PLATFORMS.items()} == {k: k for k in KINDS}
    assert BUILTIN_PLATFORMS["cuda"] == Platform("cuda", "cuda", "CUDA_VISIBLE_DEVICES", "GPU")
    assert BUILTIN_PLATFORMS["rocm"] == Platform("rocm", "rocm", "HIP_VISIBLE_DEVICES", "GPU")
    assert BUILTIN_PLATFORMS["ascend"] == Platform(
        "ascend", "ascend", "ASCEND_RT_VISIBLE_DEVICES", "NPU"
    )
    assert BUILTIN_PLATFORMS["sim"] == Platform("sim", "sim", "DEVPOOL_SIM_VISIBLE_DEVICES", "SIM")


def test_load_platforms_does_not_mutate_builtins() -> None:
    load_platforms({"cuda": {"visible-env": False}})
    assert BUILTIN_PLATFORMS["cuda"].visible_env == "CUDA_VISIBLE_DEVICES"


def test_string_entry_inherits_kind_defaults() -> None:
    platforms = load_platforms({"a2a3": "ascend"})
    assert platforms["a2a3"] == Platform("a2a3", "ascend", "ASCEND_RT_VISIBLE_DEVICES", "NPU")
    assert set(BUILTIN_PLATFORMS) < set(platforms)


def test_table_entry_overrides_variable_and_resource() -> None:
    table = {"a2a3sim": {"kind": "sim", "visible-env": "MY_VAR", "ray-resource": "NPU"}}
    assert load_platforms(table)["a2a3sim"] == Platform("a2a3sim", "sim", "MY_VAR", "NPU")


def test_table_entry_with_only_kind_inherits_defaults() -> None:
    platforms = load_platforms({"mi300": {"kind": "rocm"}})
    assert platforms["mi300"] == Platform("mi300", "rocm", "HIP_VISIBLE_DEVICES", "GPU")


def test_visible_env_false_turns_the_variable_off() -> None:
    platforms = load_platforms({"a2a3sim": {"kind": "sim", "visible-env": False}})
    assert platforms["a2a3sim"].visible_env is None
    assert platforms["a2a3sim"].ray_resource == "SIM"


def test_builtin_can_be_overridden_without_kind() -> None:
    platforms = load_platforms({"cuda": {"visible-env": False, "ray-resource": "A100"}})
    assert platforms["cuda"] == Platform("cuda", "cuda", None, "A100")


def test_builtin_override_with_matching_kind() -> None:
    platforms = load_platforms({"ascend": {"kind": "ascend", "ray-resource": "Ascend910"}})
    assert platforms["ascend"].ray_resource == "Ascend910"


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (
            {"a2a3": "asend"},
            "[tool.devpool.platforms] a2a3: unknown kind 'asend'; did you mean ascend?",
        ),
        ({"a2a3": {"kind": "gpu"}}, "a2a3: unknown kind 'gpu'; expected one of"),
        (
            {"a2a3": {"kind": "ascend", "visible_env": "X"}},
            "[tool.devpool.platforms.a2a3] has unknown key 'visible_env'; "
            "did you mean visible-env?",
        ),
        ({"a2a3": {"visible-env": "X"}}, "a2a3: missing kind"),
        ({"a2a3": {"kind": 3}}, "a2a3: kind must be a string, not int"),
        ({"a2a3": {"kind": "ascend", "visible-env": True}}, "a2a3: visible-env must be"),
        ({"a2a3": {"kind": "ascend", "visible-env": 1}}, "a2a3: visible-env must be"),
        ({"a2a3": {"kind": "ascend", "visible-env": "BAD VAR"}}, "a2a3: visible-env must be"),
        ({"a2a3": {"kind": "ascend", "ray-resource": 2}}, "a2a3: ray-resource must be"),
        ({"a2a3": {"kind": "ascend", "ray-resource": ""}}, "a2a3: ray-resource must be"),
        ({"a2a3": 7}, "a2a3: expected a kind"),
        ({"a2a3": ["ascend"]}, "a2a3: expected a kind"),
        ({"1gpu": "cuda"}, "'1gpu': a platform name must start with a letter"),
        ({"my gpu": "cuda"}, "'my gpu': a platform name"),
        ({"a:b": "cuda"}, "'a:b': a platform name"),
        ({"auto": "cuda"}, "auto: 'auto' is reserved"),
        ({"cuda": "rocm"}, "cuda: the built-in platform cuda has kind cuda"),
        ({"sim": {"kind": "cuda"}}, "sim: the built-in platform sim has kind sim"),
    ],
)
def test_config_errors_name_the_entry(table: dict[str, object], message: str) -> None:
    with pytest.raises(DevpoolError) as error:
        load_platforms(table)
    assert str(error.value).startswith("[tool.devpool.platforms")
    assert message in str(error.value)


def test_config_that_is_not_a_table_is_rejected() -> None:
    with pytest.raises(DevpoolError, match=r"\[tool.devpool.platforms\] must be a table"):
        load_platforms(["cuda"])  # type: ignore[arg-type]


# --- resolve_inventory: spec forms ---------------------------------------------------------


def test_platform_and_ids_are_taken_as_given_where_the_platform_has_devices() -> None:
    inv = resolve_inventory("cuda:0-3,6", PLATFORMS, {}, HARDWARE)
    assert inv == Inventory(CUDA, (0, 1, 2, 3, 6), "--devices cuda:0-3,6")


@pytest.mark.parametrize("spec", ["cuda:0-3", "rocm:0", "a2a3:0-1"])
def test_explicit_ids_on_a_platform_with_no_device_or_driver_are_refused(spec: str) -> None:
    """A run that did not use the hardware must never read green."""
    with pytest.raises(DevpoolError) as error:
        resolve_inventory(spec, PLATFORMS, {}, detectors())
    message = str(error.value)
    ids = spec.split(":")[1]
    assert message.startswith(f"--devices {spec}: this host has no {spec.split(':')[0]} device")
    assert message.endswith(f"to run on simulated devices, write --devices sim:{ids}")


@pytest.mark.parametrize("name", ["sim", "a2a3", "a2a3sim"])
def test_platform_and_ids_for_custom_and_sim_platforms(name: str) -> None:
    inv = resolve_inventory(f"{name}:0,2,5", PLATFORMS, {}, HARDWARE)
    assert inv.platform is PLATFORMS[name]
    assert inv.devices == (0, 2, 5)


def test_unknown_platform_lists_the_known_ones() -> None:
    with pytest.raises(DevpoolError) as error:
        resolve_inventory("a2a5:0-3", PLATFORMS, {}, detectors())
    message = str(error.value)
    assert "unknown platform 'a2a5'" in message
    assert "a2a3, a2a3sim, ascend, cuda, rocm, sim" in message


def test_unknown_platform_alone_is_named() -> None:
    with pytest.raises(DevpoolError, match="unknown platform 'tpu'"):
        resolve_inventory("tpu", PLATFORMS, {}, detectors(cuda=[0]))


@pytest.mark.parametrize(
    "spec", ["cuda:", ":0-3", "cuda:a-b", "cuda:0-3:1", "", "  ", "auto:0-3", "cuda:-1", "0-", "?"]
)
def test_malformed_spec(spec: str) -> None:
    with pytest.raises(DevpoolError) as error:
        resolve_inventory(spec, PLATFORMS, {}, detectors(cuda=[0]))
    assert str(error.value) == (
        f"--devices {spec!r} is malformed: expected auto, PLATFORM, PLATFORM:IDS or IDS, "
        "e.g. cuda:0-7 or 0,2,5"
    )


@pytest.mark.parametrize(("spec", "part"), [("cuda:5-2", "runs backwards"), ("0,0", "repeats")])
def test_well_formed_spec_with_bad_ids_names_option(spec: str, part: str) -> None:
    with pytest.raises(DevpoolError) as error:
        resolve_inventory(spec, PLATFORMS, {}, detectors(cuda=[0, 1, 2, 3, 4, 5]))
    assert str(error.value).startswith(f"--devices {spec}: ")
    assert part in str(error.value)


def test_platform_alone_detects_its_kind() -> None:
    inv = resolve_inventory("a2a3", PLATFORMS, {}, detectors(cuda=[0, 1], ascend=[3, 1, 2]))
    assert inv.platform is PLATFORMS["a2a3"]
    assert inv.devices == (1, 2, 3)
    assert inv.source == "--devices a2a3: detected"


def test_platform_alone_with_nothing_detected() -> None:
    with pytest.raises(DevpoolError, match="--devices rocm found no rocm devices"):
        resolve_inventory("rocm", PLATFORMS, {}, detectors(cuda=[0]))


@pytest.mark.parametrize("name", ["sim", "a2a3sim"])
def test_sim_platform_alone_cannot_be_detected(name: str) -> None:
    with pytest.raises(DevpoolError) as error:
        resolve_inventory(name, PLATFORMS, {}, detectors(cuda=[0]))
    assert f"{name} devices cannot be detected; give ids, e.g. --devices {name}:0-7" in str(
        error.value
    )


def test_ids_alone_detect_the_platform() -> None:
    inv = resolve_inventory("0-1,3", PLATFORMS, {}, detectors(ascend=[0, 1, 2, 3]))
    assert inv.platform is BUILTIN_PLATFORMS["ascend"]
    assert inv.devices == (0, 1, 3)
    assert "ascend" in inv.source


def test_ids_alone_must_exist_on_the_host() -> None:
    with pytest.raises(DevpoolError) as error:
        resolve_inventory("0-5", PLATFORMS, {}, detectors(cuda=[0, 1, 2, 3]))
    assert "asks for cuda devices 4,5 that this host does not have (found 0-3)" in str(error.value)


def test_ids_alone_with_nothing_detected_name_what_was_written() -> None:
    with pytest.raises(DevpoolError) as error:
        resolve_inventory("0-3", PLATFORMS, {}, detectors())
    assert str(error.value).startswith(
        "--devices 0-3 gives device ids without a platform, and this host has no accelerator"
    )
    assert str(error.value).endswith("e.g. --devices sim:0-3")


def test_ids_alone_outside_a_visibility_variable_say_it_hides_them() -> None:
    """As --devices cuda:4-5 does, whether or not a card was found (issue 39, 3)."""
    environ = {"CUDA_VISIBLE_DEVICES": "0,1"}
    for found in (detectors(), detectors(cuda=[0, 1, 2, 3, 4, 5])):
        with pytest.raises(DevpoolError) as error:
            resolve_inventory("4-5", PLATFORMS, environ, found)
        assert str(error.value) == (
            "--devices 4-5 asks for devices 4,5 that CUDA_VISIBLE_DEVICES=0,1 hides; "
            "ask for a subset of 0,1 or unset CUDA_VISIBLE_DEVICES"
        )


# --- auto ----------------------------------------------------------------------------------


def test_auto_prefers_cuda_then_ascend_then_rocm() -> None:
    inv = resolve_inventory("auto", PLATFORMS, {}, detectors(cuda=[0, 1], ascend=[0], rocm=[0]))
    assert inv.platform is CUDA
    assert inv.source == "auto: nvml/nvidia-smi"
    inv = resolve_inventory("auto", PLATFORMS, {}, detectors(cuda=[], ascend=[0, 1], rocm=[0]))
    assert inv.platform is BUILTIN_PLATFORMS["ascend"]
    assert inv.source == "auto: npu-smi"
    inv = resolve_inventory("auto", PLATFORMS, {}, detectors(rocm=[2, 0]))
    assert (inv.platform, inv.devices) == (BUILTIN_PLATFORMS["rocm"], (0, 2))


def test_auto_uses_the_projects_override_of_a_builtin() -> None:
    platforms = load_platforms({"cuda": {"visible-env": False}})
    inv = resolve_inventory(
        "auto", platforms, {"CUDA_VISIBLE_DEVICES": "0"}, detectors(cuda=[0, 1])
    )
    # visible-env = false: the variable is neither read nor able to narrow.
    assert inv.platform.visible_env is None
    assert inv.devices == (0, 1)


def test_auto_with_nothing_found_is_a_pool_of_no_devices() -> None:
    # A laptop with devices = "auto" in pyproject runs its CPU tests, not a usage error.
    inv = resolve_inventory("auto", PLATFORMS, {}, detectors(cuda=None, ascend=[], rocm=None))
    assert inv.devices == ()
    # Neither name nor kind matches a platforms([...]) marker: sim-only tests do not run.
    assert (inv.platform.name, inv.platform.kind) == ("none", "none")
    assert inv.platform.visible_env is None
    assert inv.describe() == "no devices"
    assert inv.source == "auto: no accelerator found (looked for NVIDIA, Ascend and ROCm devices)"


def test_a_named_platform_with_nothing_found_stays_an_error() -> None:
    # Only auto falls back: asking for cuda by name on a host without one is a mistake.
    with pytest.raises(DevpoolError, match="--devices cuda found no cuda devices"):
        resolve_inventory("cuda", PLATFORMS, {}, detectors())


def test_default_detectors_are_used_for_missing_kinds(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def fake_detect(kind: str, timeout: float = 10.0) -> list[int] | None:
        asked.append(kind)
        return [0, 1] if kind == "rocm" else None

    monkeypatch.setattr(inventory, "detect", fake_detect)
    inv = resolve_inventory("auto", PLATFORMS, {}, {"cuda": fixed(None)})
    assert asked == ["ascend", "rocm"]
    assert inv.platform is BUILTIN_PLATFORMS["rocm"]


# --- narrowing by a visibility variable ----------------------------------------------------


def test_auto_is_narrowed_by_the_variable() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "2,3"}
    inv = resolve_inventory("auto", PLATFORMS, env, detectors(cuda=[0, 1, 2, 3]))
    assert inv.devices == (2, 3)
    assert inv.source == "auto: nvml/nvidia-smi, narrowed by CUDA_VISIBLE_DEVICES=2,3"


def test_platform_alone_is_narrowed_by_its_own_variable() -> None:
    env = {"ASCEND_RT_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "0"}
    inv = resolve_inventory("a2a3", PLATFORMS, env, detectors(ascend=[0, 1, 2]))
    assert inv.devices == (1,)
    assert "narrowed by ASCEND_RT_VISIBLE_DEVICES=1" in inv.source


def test_narrowing_to_ids_that_are_not_detected_is_an_error() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "2,9"}
    with pytest.raises(DevpoolError) as error:
        resolve_inventory("auto", PLATFORMS, env, detectors(cuda=[0, 1, 2, 3]))
    assert "CUDA_VISIBLE_DEVICES=2,9 lists cuda devices 9 that detection did not find" in str(
        error.value
    )


@pytest.mark.parametrize("value", ["", " ", "-1"])
def test_variable_hiding_everything_is_an_error(value: str) -> None:
    env = {"CUDA_VISIBLE_DEVICES": value}
    with pytest.raises(DevpoolError, match="hides every cuda device"):
        resolve_inventory("auto", PLATFORMS, env, detectors(cuda=[0, 1]))
    with pytest.raises(DevpoolError, match="hides every cuda device"):
        resolve_inventory("cuda:0", PLATFORMS, env, detectors())


def test_unreadable_variable_is_an_error() -> None:
    env = {"HIP_VISIBLE_DEVICES": "0,x"}
    with pytest.raises(DevpoolError, match="HIP_VISIBLE_DEVICES=0,x is not a comma-separated"):
        resolve_inventory("rocm:0", PLATFORMS, env, detectors())


def test_explicit_ids_inside_the_variable_pass() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    inv = resolve_inventory("cuda:1-2", PLATFORMS, env, HARDWARE)
    assert inv.devices == (1, 2)


def test_explicit_ids_outside_the_variable_are_an_error() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    with pytest.raises(DevpoolError) as error:
        resolve_inventory("cuda:0-7", PLATFORMS, env, detectors())
    assert str(error.value).startswith(
        "--devices cuda:0-7 asks for devices 4,5,6,7 that CUDA_VISIBLE_DEVICES=0,1,2,3 hides;"
    )


def test_ids_alone_are_checked_against_the_variable() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0,1"}
    with pytest.raises(DevpoolError, match="asks for devices 2 that CUDA_VISIBLE_DEVICES=0,1"):
        resolve_inventory("1-2", PLATFORMS, env, detectors(cuda=[0, 1, 2, 3]))


def test_custom_variable_narrows_and_disabled_variable_does_not() -> None:
    platforms = load_platforms(
        {
            "mysim": {"kind": "sim", "visible-env": "MY_VAR"},
            "offsim": {"kind": "sim", "visible-env": False},
        }
    )
    with pytest.raises(DevpoolError, match="MY_VAR=0 hides"):
        resolve_inventory("mysim:0-1", platforms, {"MY_VAR": "0"}, detectors())
    env = {"DEVPOOL_SIM_VISIBLE_DEVICES": "0"}
    inv = resolve_inventory("offsim:0-1", platforms, env, detectors())
    assert inv.devices == (0, 1)


def test_cuda_uuids_are_mapped_on_detected_paths(
    tool_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_tool(
        tool_dir,
        "nvidia-smi",
        "printf '0, GPU-aaaa-1111\\n1, GPU-bbbb-2222\\n2, GPU-cccc-3333\\n'",
    )
    env = {"CUDA_VISIBLE_DEVICES": "GPU-cccc-3333,GPU-aaaa"}
    inv = resolve_inventory("auto", PLATFORMS, env, detectors(cuda=[0, 1, 2]))
    assert inv.devices == (0, 2)


def test_cuda_uuid_that_matches_nothing(tool_dir: Path) -> None:
    fake_tool(tool_dir, "nvidia-smi", "echo '0, GPU-aaaa'")
    env = {"CUDA_VISIBLE_DEVICES": "GPU-ffff"}
    with pytest.raises(DevpoolError, match="could not map 'GPU-ffff'.*matches no device"):
        resolve_inventory("cuda", PLATFORMS, env, detectors(cuda=[0]))


def test_cuda_uuids_without_nvidia_smi_cannot_be_mapped(tool_dir: Path) -> None:
    env = {"CUDA_VISIBLE_DEVICES": "GPU-aaaa"}
    with pytest.raises(DevpoolError, match="could not map the UUIDs in CUDA_VISIBLE_DEVICES"):
        resolve_inventory("auto", PLATFORMS, env, detectors(cuda=[0]))


def test_cuda_uuids_against_explicit_ids_are_an_error() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "GPU-aaaa"}
    with pytest.raises(DevpoolError, match="names devices by UUID"):
        resolve_inventory("cuda:0", PLATFORMS, env, detectors())


# --- detect --------------------------------------------------------------------------------


@pytest.mark.usefixtures("no_pynvml")
@pytest.mark.parametrize("kind", ["cuda", "ascend", "rocm"])
def test_detect_returns_none_when_the_tool_is_absent(
    kind: str, tool_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rocm, "_KFD", tmp_path / "no-kfd")
    assert detect(kind, timeout=5) is None


def test_detect_sim_is_never_detected() -> None:
    assert detect("sim") is None


def test_detect_unknown_kind_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown device kind 'tpu'"):
        detect("tpu")


@pytest.mark.usefixtures("no_pynvml")
def test_detect_returns_none_when_the_tool_hangs(tool_dir: Path) -> None:
    fake_tool(tool_dir, "nvidia-smi", f"exec {SLEEP} 30")
    start = time.monotonic()
    assert detect("cuda", timeout=0.5) is None
    elapsed = time.monotonic() - start
    # At least the timeout: proves the tool really ran and hung rather than failing to start.
    assert 0.4 < elapsed < 10


@pytest.mark.usefixtures("no_pynvml")
@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("printf '0\\n1\\n2\\n'", [0, 1, 2]),
        ("printf '1\\n0\\n\\n'", [0, 1]),
        ("echo 'No devices were found'", None),
        ("echo ''", None),
        ("exit 9", None),
    ],
)
def test_detect_cuda_parses_nvidia_smi(
    tool_dir: Path, script: str, expected: list[int] | None
) -> None:
    fake_tool(tool_dir, "nvidia-smi", script)
    assert detect("cuda", timeout=5) == expected


def test_detect_cuda_prefers_nvml(monkeypatch: pytest.MonkeyPatch, tool_dir: Path) -> None:
    calls: list[str] = []

    class FakeNvml:
        @staticmethod
        def nvmlInit() -> None:
            calls.append("init")

        @staticmethod
        def nvmlDeviceGetCount() -> int:
            return 4

        @staticmethod
        def nvmlShutdown() -> None:
            calls.append("shutdown")

    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml)
    assert detect("cuda", timeout=5) == [0, 1, 2, 3]
    assert calls == ["init", "shutdown"]


def test_detect_cuda_falls_back_when_nvml_fails(
    monkeypatch: pytest.MonkeyPatch, tool_dir: Path
) -> None:
    class BrokenNvml:
        @staticmethod
        def nvmlInit() -> None:
            raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", BrokenNvml)
    fake_tool(tool_dir, "nvidia-smi", "printf '0\\n1\\n'")
    assert detect("cuda", timeout=5) == [0, 1]


NPU_SMI_INFO = """
        Total Count                    : 2

        NPU ID                         : 0
        Chip Count                     : 1

        NPU ID                         : 4
        Chip Count                     : 1
"""


def test_detect_ascend_parses_npu_smi(tool_dir: Path) -> None:
    # PATH holds only tool_dir, so the fake tools use shell builtins.
    fake_tool(tool_dir, "npu-smi", f"printf '%s' '{NPU_SMI_INFO}'")
    assert detect("ascend", timeout=5) == [0, 4]


def test_detect_ascend_with_unparsable_output(tool_dir: Path) -> None:
    fake_tool(tool_dir, "npu-smi", "echo 'dcmi module initialize failed'")
    assert detect("ascend", timeout=5) is None


def test_detect_rocm_parses_rocm_smi(tool_dir: Path) -> None:
    fake_tool(
        tool_dir,
        "rocm-smi",
        "printf 'device,Device Name,Device ID\\ncard0,MI300X,0x74a1\\ncard1,MI300X,0x74a1\\n'",
    )
    assert detect("rocm", timeout=5) == [0, 1]


def test_detect_rocm_counts_amd_render_nodes_without_rocm_smi(
    tool_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kfd = tmp_path / "kfd"
    kfd.touch()
    drm = tmp_path / "drm"
    for node, vendor in [
        ("renderD128", "0x1002"),
        ("renderD129", "0x8086"),
        ("renderD130", "0x1002"),
    ]:
        (drm / node / "device").mkdir(parents=True)
        (drm / node / "device" / "vendor").write_text(vendor + "\n")
    monkeypatch.setattr(rocm, "_KFD", kfd)
    monkeypatch.setattr(rocm, "_DRM_SYS", drm)
    assert detect("rocm", timeout=5) == [0, 1]
    os.remove(kfd)
    assert detect("rocm", timeout=5) is None


def test_a_platform_ids_spec_is_read_in_one_place() -> None:
    """--devices, `devpool select --devices` and `devpool capacity --devices` read
    PLATFORM:IDS alike: the same ids, the same sentence for a mistake."""
    from devpool.capacity.cli import _spec_platform
    from devpool.select.cli import _spec_shape

    assert inventory.named_ids(" sim:0-2,5 ") == ("sim", [0, 1, 2, 5])
    assert inventory.named_ids("auto") is None and inventory.named_ids("0-3") is None
    assert _spec_shape("cuda:0-7", True) == ("cuda", 8)
    assert _spec_platform("cuda:0-7", {}) == ("cuda", 8)
    for read in (
        inventory.named_ids,
        lambda spec: _spec_shape(spec, True),
        lambda spec: _spec_platform(spec, {}),
    ):
        with pytest.raises(DevpoolError, match=r"^--devices .cuda:0-x. is malformed"):
            read("cuda:0-x")
