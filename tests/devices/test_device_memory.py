"""device_memory requests: sizes, markers, settings, capacity and what can never be met."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from devpool.config import settings_from
from devpool.devices.inventory import Inventory, Platform, device_memory, load_platforms
from devpool.devices.memory import (
    Overrun,
    capacity_of,
    check_overrun,
    read_sim_usage,
    usable_memory,
    worker_env,
)
from devpool.devices.sizes import format_size, parse_size
from devpool.errors import DevpoolError
from devpool.plan.jobs import Job, build_plan, unsatisfiable_reason
from devpool.plan.markers import Request, request_for

GiB = 2**30
NODEID = "tests/test_x.py::test_small"


@dataclass
class FakeItem:
    marks: list[pytest.MarkDecorator] = field(default_factory=list)
    nodeid: str = NODEID

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        return next((m.mark for m in self.marks if m.name == name), None)

    def iter_markers(self, name: str | None = None) -> Iterator[pytest.Mark]:
        return (m.mark for m in self.marks if name is None or m.name == name)


def request(*marks: pytest.MarkDecorator, default: int | None = None) -> Request:
    return request_for(FakeItem(list(marks)), ("sim",), default)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("8GiB", 8 * GiB),
        ("8 GiB", 8 * GiB),
        ("8Gi", 8 * GiB),
        ("512MiB", 512 * 2**20),
        ("1.5GB", 1_500_000_000),
        ("80G", 80 * 10**9),
        ("0.5gib", GiB // 2),
        (4096, 4096),
        ("4096", 4096),
    ],
)
def test_sizes_parse(text: object, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "GiB", "8 parsecs", "0GiB", "-1GiB", True, 1.5, "8GiBs"])
def test_bad_sizes_are_refused(text: object) -> None:
    with pytest.raises(ValueError, match="memory size"):
        parse_size(text)


def test_sizes_format() -> None:
    assert format_size(8 * GiB) == "8 GiB"
    assert format_size(14.2 * GiB) == "14.2 GiB"
    assert format_size(512 * 2**20) == "512 MiB"
    assert format_size(100) == "100 B"


def test_device_memory_alone_asks_for_one_device() -> None:
    got = request(pytest.mark.device_memory("8GiB"))
    assert (got.device_count, got.device_memory) == (1, 8 * GiB)
    assert got.describe() == "1 device × 8 GiB"


def test_device_memory_is_per_device_with_device_count() -> None:
    got = request(pytest.mark.device_memory("512MiB"), pytest.mark.device_count(2))
    assert (got.device_count, got.device_memory) == (2, 512 * 2**20)
    assert got.describe() == "2 devices × 512 MiB"


def test_the_suite_default_applies_to_device_tests_that_do_not_say() -> None:
    assert request(pytest.mark.device_count(1), default=4 * GiB).device_memory == 4 * GiB
    assert request(default=4 * GiB).device_memory is None  # a CPU test stays one
    own = request(pytest.mark.device_memory("1GiB"), default=4 * GiB)
    assert own.device_memory == GiB


def test_device_exclusive_demands_a_whole_device_over_the_default() -> None:
    got = request(pytest.mark.device_exclusive, default=4 * GiB)
    assert (got.device_count, got.device_memory, got.device_exclusive) == (1, None, True)
    assert got.describe() == "1 device, exclusive"


@pytest.mark.parametrize(
    ("marks", "says"),
    [
        ([pytest.mark.device_memory("8 parsecs")], "device_memory('8 parsecs') needs a memory"),
        ([pytest.mark.device_memory()], "takes one size"),
        ([pytest.mark.device_memory("1GiB", "2GiB")], "takes one size"),
        ([pytest.mark.device_memory(size="1GiB")], "takes one size"),
        ([pytest.mark.device_memory(0)], "above zero"),
        (
            [pytest.mark.device_memory("1GiB"), pytest.mark.device_exclusive],
            "contradict each other",
        ),
    ],
)
def test_bad_markers_name_the_test_in_one_sentence(
    marks: list[pytest.MarkDecorator], says: str
) -> None:
    with pytest.raises(DevpoolError) as info:
        request(*marks)
    message = str(info.value)
    assert message.startswith(NODEID + ": @pytest.mark.device_"), message
    assert says in message and "\n" not in message


def test_settings_read_device_memory_and_reserve() -> None:
    settings = settings_from({}, {"device-memory": "4GiB", "memory-reserve": "10%"}, "pyproject")
    assert (settings.device_memory, settings.memory_reserve) == (4 * GiB, 0.1)
    plain = settings_from({}, {}, "pyproject")
    assert (plain.device_memory, plain.memory_reserve) == (None, 0.05)
    cli = settings_from({"devpool_device_memory": "1GiB", "devpool_memory_reserve": "0"}, {}, "p")
    assert (cli.device_memory, cli.memory_reserve) == (GiB, 0.0)


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ({"device-memory": "lots"}, "[tool.devpool] device-memory must be a memory size"),
        ({"memory-reserve": "100%"}, "[tool.devpool] memory-reserve must be a share"),
        ({"memory-reserve": "a bit"}, "[tool.devpool] memory-reserve must be a share"),
    ],
)
def test_bad_settings_are_one_sentence(table: dict[str, object], says: str) -> None:
    with pytest.raises(DevpoolError, match=r"^pyproject: ") as info:
        settings_from({}, table, "pyproject")
    assert says in str(info.value)


def test_sim_capacity_comes_from_the_platforms_table_less_the_reserve() -> None:
    platforms = load_platforms({"simbig": {"kind": "sim", "memory": "80GiB"}})
    inventory = Inventory(platforms["simbig"], (0, 1), "test")
    assert device_memory(platforms["simbig"], (0, 1)) == {0: 80 * GiB, 1: 80 * GiB}
    assert capacity_of(inventory, 0.05) == {0: int(80 * GiB * 0.95), 1: int(80 * GiB * 0.95)}
    plain = Inventory(load_platforms(None)["sim"], (0, 1), "test")
    assert capacity_of(plain, 0.05) == {}  # unknown: nothing is shared


def test_a_bad_platform_memory_is_one_sentence() -> None:
    with pytest.raises(DevpoolError, match=r"simbig: memory must be a memory size"):
        load_platforms({"simbig": {"kind": "sim", "memory": "big"}})


def test_cuda_capacity_from_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    from devpool.devices.detection import cuda

    monkeypatch.setattr(cuda.importlib, "import_module", _no_module)
    monkeypatch.setattr(cuda, "run_tool", lambda argv, timeout: "0, 81559\n1, 81559\n")
    cuda = load_platforms(None)["cuda"]
    assert device_memory(cuda, (1,)) == {1: 81559 * 2**20}


def test_ascend_capacity_from_npu_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    from devpool.devices.detection import ascend

    answers = {
        "0": "NPU ID : 0\n DDR Capacity(MB) : 15171\n HBM Capacity(MB) : 65536\n",
        "1": "NPU ID : 1\n DDR Capacity(MB) : 8192\n",
    }
    monkeypatch.setattr(ascend, "run_tool", lambda argv, timeout: answers.get(argv[-1]))
    ascend = load_platforms(None)["ascend"]
    assert device_memory(ascend, (0, 1, 2)) == {0: 65536 * 2**20, 1: 8192 * 2**20}


def _no_module(name: str) -> object:
    raise ImportError(name)


SIM = Platform("sim", "sim", "DEVPOOL_SIM_VISIBLE_DEVICES", "SIM", 80 * GiB)
SIM2 = Inventory(SIM, (0, 1), "test")


def test_a_request_larger_than_a_device_is_unsatisfiable_loudly() -> None:
    capacity = usable_memory({0: 80 * GiB, 1: 80 * GiB}, 0.05)
    big = Request(device_count=1, device_memory=79 * GiB)
    reason = unsatisfiable_reason(big, SIM2, "local", capacity)
    assert reason == (
        "needs 1 device × 79 GiB; a sim device hands out at most 76 GiB "
        "(its memory less --devpool-memory-reserve)"
    )
    fits = Request(device_count=2, device_memory=76 * GiB)
    assert unsatisfiable_reason(fits, SIM2, "local", capacity) is None


def test_memory_requests_hold_whole_devices_where_memory_is_unknown() -> None:
    job = Job(0, "t::a", ("t", 1, "a"), Request(device_count=1, device_memory=GiB), 0)
    plan = build_plan([job], Inventory(load_platforms(None)["sim"], (0,), "t"), memory={})
    assert plan.jobs == [job] and job.memory_needed is None
    assert plan.notes and "memory of sim devices is unknown" in plan.notes[0]


def test_an_overrun_is_named() -> None:
    overrun = check_overrun("sim", 8 * GiB, {0: int(14.2 * GiB), 1: GiB})
    assert overrun == Overrun("sim", 0, int(14.2 * GiB), 8 * GiB)
    assert overrun.describe() == "used 14.2 GiB on sim:0, declared 8 GiB"
    assert check_overrun("sim", 8 * GiB, {0: 8 * GiB}) is None


def test_sim_usage_file_forms(tmp_path: Path) -> None:
    path = tmp_path / "use.json"
    assert read_sim_usage(path, (0,)) == {}
    path.write_text(str(3 * GiB))
    assert read_sim_usage(path, (2, 3)) == {2: 3 * GiB, 3: 3 * GiB}
    path.write_text('{"2": 1024, "9": 5}')
    assert read_sim_usage(path, (2, 3)) == {2: 1024}
    path.write_text('{"2": 10')  # half-written
    assert read_sim_usage(path, (2,)) == {}


def test_worker_env_carries_the_declaration() -> None:
    assert worker_env(None, {0: GiB}) == {}
    assert worker_env(GiB, {0: 4 * GiB}) == {
        "DEVPOOL_DEVICE_MEMORY": str(GiB),
        "DEVPOOL_DEVICE_TOTAL": str(4 * GiB),
    }


def test_capacity_reports_device_memory_seconds(pytester: pytest.Pytester) -> None:
    from devpool.capacity.report import collect_suite, render_text, report, to_json

    pytester.makepyprojecttoml('[tool.devpool]\ndevice-memory = "2GiB"\n')
    pytester.makepyfile(
        test_mem="""
        import pytest

        @pytest.mark.device_memory("8GiB")
        @pytest.mark.device_count(2)
        def test_big(): pass

        @pytest.mark.device_count(1)
        def test_default(): pass

        @pytest.mark.device_exclusive
        def test_whole(): pass

        def test_cpu(): pass
        """
    )
    seen = collect_suite([str(pytester.path), "-p", "no:hypothesispytest"])
    memory = {t.nodeid.split("::")[1]: t.device_memory for t in seen.tests}
    assert memory == {
        "test_big": 8 * GiB,
        "test_default": 2 * GiB,
        "test_whole": None,
        "test_cpu": None,
    }
    rep = report(seen.tests, "sim", None, {}, 1.0)
    assert rep.totals.memory_seconds == (2 * 8 + 2) * GiB
    text = render_text(rep)
    assert "memory GiB-s" in text
    assert to_json(rep)["totals"]["device_memory_gib_seconds"] == 18.0
    plain = report([t for t in seen.tests if t.device_memory is None], "sim", None, {}, 1.0)
    assert "memory GiB-s" not in render_text(plain)


def test_the_watch_names_a_sim_overrun_and_keeps_the_peak(tmp_path: Path) -> None:
    from devpool.devices.memory import MemoryWatch

    use = tmp_path / "use.json"
    watch = MemoryWatch("sim", "sim", (0, 1), 8 * GiB, sim_file=use)
    assert watch.poll() is None  # nothing written yet
    use.write_text(json.dumps({"0": 6 * GiB, "1": 2 * GiB}))
    assert watch.poll() is None
    use.write_text(json.dumps({"0": int(14.2 * GiB)}))
    overrun = watch.poll()
    assert overrun is not None
    assert overrun.describe() == "used 14.2 GiB on sim:0, declared 8 GiB"
    assert watch.peak == {0: int(14.2 * GiB), 1: 2 * GiB}


def test_torch_limit_is_skipped_without_a_declaration_or_torch() -> None:
    from devpool.devices.memory import apply_torch_limit

    assert apply_torch_limit({}) is None
    env = {"DEVPOOL_DEVICE_MEMORY": str(GiB), "DEVPOOL_DEVICE_TOTAL": str(4 * GiB)}
    try:
        import torch  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
    except ImportError:
        assert apply_torch_limit(env) is None
    else:
        assert apply_torch_limit(env) == 0.25
