"""session/collected.read_requests: each collected test's request, which tests the platform
filter drops (and why), and the user errors it turns into one pytest.UsageError."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from devpool.config import Settings
from devpool.session.collected import read_requests

SUITE = """
import pytest

def test_plain():
    pass

@pytest.mark.device_count(2)
@pytest.mark.nodes(2)
def test_two_nodes():
    pass

@pytest.mark.platforms(["cuda"])
@pytest.mark.device_count(1)
def test_cuda_only():
    pass

@pytest.mark.platforms(["sim", "cuda"])
def test_sim_too():
    pass

@pytest.mark.platforms(["simulated"])
def test_by_kind():
    pass
"""


def _items(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, source: str
) -> list[pytest.Item]:
    """The collected items, no plugin loaded: only devpool's marker reading is under test."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(source)
    items, _ = pytester.inline_genitems("-p", "no:cacheprovider")
    return items


def _inventory() -> Any:
    return SimpleNamespace(platform=SimpleNamespace(name="sim", kind="simulated"), devices=(0, 1))


def _settings(**options: Any) -> Settings:
    known: Any = {"sim": None, "cuda": None, "simulated": None}
    return Settings(devices=None, platforms=known, cpu_slots=2, **options)


def test_tests_another_platform_is_for_are_dropped_with_the_reason(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    items = _items(pytester, monkeypatch, SUITE)
    found = read_requests(items, _settings(), _inventory())
    kept = [item.name for item in found.keep]
    assert kept == ["test_plain", "test_two_nodes", "test_sim_too", "test_by_kind"]
    assert [item.name for item in found.dropped] == ["test_cuda_only"]
    assert list(found.requests) == [item.nodeid for item in found.keep]
    (dropped,) = found.deselected
    assert dropped[0].endswith("::test_cuda_only")
    assert dropped[1] == "platform sim not in platforms([cuda])"
    # what each asks for is kept for every test, dropped ones too (a queue's classes)
    asked = {nodeid.rsplit("::", 1)[-1]: n for nodeid, n in found.asked.items()}
    assert asked == {
        "test_plain": 0,
        "test_two_nodes": 4,
        "test_cuda_only": 1,
        "test_sim_too": 0,
        "test_by_kind": 0,
    }
    classes = {nodeid.rsplit("::", 1)[-1]: c for nodeid, c in found.classes.items()}
    assert classes == {
        "test_cuda_only": ("cuda",),
        "test_sim_too": ("sim", "cuda"),
        "test_by_kind": ("simulated",),
    }


def test_cpus_beyond_the_slots_is_a_usage_error_unless_skipped(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    items = _items(
        pytester,
        monkeypatch,
        """
        import pytest

        @pytest.mark.cpus(8)
        def test_greedy():
            pass
        """,
    )
    with pytest.raises(pytest.UsageError, match=r"::test_greedy: .*--devpool-skip-unsatisfiable"):
        read_requests(items, _settings(), _inventory())
    found = read_requests(items, _settings(skip_unsatisfiable=True), _inventory())
    assert [item.name for item in found.keep] == ["test_greedy"]
    assert next(iter(found.requests.values())).cpus == 8


def test_a_marker_written_wrong_is_one_usage_error_naming_the_test(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    items = _items(
        pytester,
        monkeypatch,
        """
        import pytest

        @pytest.mark.platforms(["tpu"])
        def test_unknown_platform():
            pass
        """,
    )
    with pytest.raises(pytest.UsageError, match="test_unknown_platform") as info:
        read_requests(items, _settings(), _inventory())
    assert info.value.__cause__ is None  # one sentence, no chained traceback
