"""Unit tests for devpool.plan.markers: each marker into a Request, and each bad form's error."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from devpool.errors import DevpoolError
from devpool.plan.markers import Request, request_for

KNOWN = ("cuda", "sim", "a2a3")
NODEID = "tests/test_x.py::TestY::test_z[2]"


@dataclass
class FakeItem:
    """Just what request_for reads from a pytest.Item."""

    marks: list[pytest.MarkDecorator] = field(default_factory=list)
    nodeid: str = NODEID

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        return next((m.mark for m in self.marks if m.name == name), None)

    def iter_markers(self, name: str | None = None) -> Iterator[pytest.Mark]:
        return (m.mark for m in self.marks if name is None or m.name == name)


def request(*marks: pytest.MarkDecorator) -> Request:
    return request_for(FakeItem(list(marks)), KNOWN)  # type: ignore[arg-type]


def error(*marks: pytest.MarkDecorator) -> str:
    with pytest.raises(DevpoolError) as info:
        request(*marks)
    message = str(info.value)
    assert message.startswith(NODEID + ": "), message
    assert "\n" not in message
    return message


def test_no_markers_is_a_cpu_request() -> None:
    assert request() == Request(device_count=0, platforms=None, nodes=1, isolate=False)
    assert request().describe() == "cpu"


def test_every_marker_lands_in_the_request() -> None:
    got = request(
        pytest.mark.device_count(2),
        pytest.mark.platforms(["cuda", "sim"]),
        pytest.mark.nodes(3),
        pytest.mark.isolate,
        pytest.mark.timeout(30),
    )

    assert got == Request(
        device_count=2, platforms=("cuda", "sim"), nodes=3, isolate=True, timeout=30.0
    )
    assert got.describe() == "3 nodes × 2 devices, isolate, timeout 30s"
    assert request(pytest.mark.device_count(1)).describe() == "1 device"


@pytest.mark.parametrize(
    "mark",
    [
        pytest.mark.platforms("sim"),
        pytest.mark.platforms(["sim"]),
        pytest.mark.platforms(("sim",)),
        pytest.mark.platforms("sim", "a2a3"),
    ],
)
def test_platforms_accepts_a_name_a_list_a_tuple_or_several_args(
    mark: pytest.MarkDecorator,
) -> None:
    assert request(mark).platforms in (("sim",), ("sim", "a2a3"))


@pytest.mark.parametrize(
    ("mark", "timeout"),
    [
        (pytest.mark.timeout(5), 5.0),
        (pytest.mark.timeout(2.5), 2.5),
        (pytest.mark.timeout(5, method="thread"), 5.0),
        (pytest.mark.timeout(timeout=7, method="signal"), 7.0),
        (pytest.mark.timeout(5, func_only=True), 5.0),
        (pytest.mark.timeout(5, "thread"), 5.0),
        (pytest.mark.timeout(0), 0.0),
    ],
)
def test_timeout_accepts_pytest_timeout_spellings(
    mark: pytest.MarkDecorator, timeout: float
) -> None:
    assert request(mark).timeout == timeout


def test_timeout_zero_means_no_limit_as_in_pytest_timeout() -> None:
    got = request(pytest.mark.timeout(0))

    assert got.timeout == 0.0  # not None: the run's default limit does not apply either
    assert got.describe() == "cpu, no timeout"


@pytest.mark.parametrize("name", ["device_count", "nodes"])
@pytest.mark.parametrize(
    ("args", "kwargs", "words"),
    [
        (("2",), {}, "needs a whole number ≥ 1, got str '2'"),
        ((0,), {}, "needs a whole number ≥ 1, got int 0"),
        ((-1,), {}, "needs a whole number ≥ 1, got int -1"),
        ((True,), {}, "needs a whole number ≥ 1, got bool True"),
        ((2.0,), {}, "needs a whole number ≥ 1, got float 2.0"),
        ((1, 2), {}, "takes exactly one whole number, got args=(1, 2) kwargs={}"),
        ((), {}, "takes exactly one whole number, got args=()"),
        ((), {"n": 2}, "takes exactly one whole number, got args=() kwargs={'n': 2}"),
    ],
)
def test_count_markers_reject_bad_forms(
    name: str, args: tuple[object, ...], kwargs: dict[str, object], words: str
) -> None:
    message = error(getattr(pytest.mark, name)(*args, **kwargs))

    assert f"@pytest.mark.{name}" in message
    assert words in message


@pytest.mark.parametrize(
    "mark",
    [
        pytest.mark.platforms(),
        pytest.mark.platforms([]),
        pytest.mark.platforms([1]),
        pytest.mark.platforms(["sim", None]),
        pytest.mark.platforms(["sim"], strict=True),
    ],
)
def test_platforms_rejects_empty_or_non_string_names(mark: pytest.MarkDecorator) -> None:
    message = error(mark)

    assert "@pytest.mark.platforms needs a list of platform names" in message
    assert "platforms(['cuda', 'sim'])" in message


def test_platforms_rejects_an_unknown_name_and_lists_the_known_ones() -> None:
    message = error(pytest.mark.platforms(["sim", "tpu"]))

    assert "names unknown platform 'tpu'" in message
    assert "known: a2a3, cuda, sim" in message
    assert "[tool.devpool.platforms]" in message


@pytest.mark.parametrize(
    ("mark", "words"),
    [
        (pytest.mark.timeout(-1.5), "needs a number of seconds ≥ 0 (0: no limit), got float -1.5"),
        (pytest.mark.timeout("5"), "needs a number of seconds ≥ 0 (0: no limit), got str '5'"),
        (pytest.mark.timeout(True), "needs a number of seconds ≥ 0 (0: no limit), got bool True"),
        (pytest.mark.timeout(), "takes one number of seconds"),
        (pytest.mark.timeout(1, 2), "takes one number of seconds"),
        (pytest.mark.timeout(1, "thread", 3), "takes one number of seconds"),
        (pytest.mark.timeout(5, method="fork"), "takes one number of seconds"),
        (pytest.mark.timeout(5, seconds=3), "takes one number of seconds"),
        (pytest.mark.timeout(5, timeout=3), "gives its seconds twice"),
    ],
)
def test_timeout_rejects_bad_forms(mark: pytest.MarkDecorator, words: str) -> None:
    message = error(mark)

    assert "@pytest.mark.timeout" in message
    assert words in message


def test_requests_from_real_items_use_the_closest_marker(pytester: pytest.Pytester) -> None:
    items = pytester.getitems(
        """
        import pytest

        @pytest.mark.device_count(4)
        class TestGroup:
            def test_inherits(self):
                pass

            @pytest.mark.device_count(1)
            @pytest.mark.isolate
            def test_overrides(self):
                pass

        @pytest.mark.platforms(["tpu"])
        def test_bad():
            pass
        """
    )
    by_name = {item.name: item for item in items}

    assert request_for(by_name["test_inherits"], KNOWN).device_count == 4
    overrides = request_for(by_name["test_overrides"], KNOWN)
    assert (overrides.device_count, overrides.isolate) == (1, True)
    with pytest.raises(DevpoolError) as info:
        request_for(by_name["test_bad"], KNOWN)
    assert str(info.value).startswith(by_name["test_bad"].nodeid + ": ")


def test_nodes_takes_a_peer_service_command() -> None:
    got = request(pytest.mark.nodes(2, peer_service="python -m http.server 9000"))

    assert got.nodes == 2
    assert got.peer_service == "python -m http.server 9000"
    assert "must be a command string" in error(pytest.mark.nodes(2, peer_service=3))
