"""Unit tests for devpool.compat: other plugins' options and markers read as devpool's."""

from __future__ import annotations

from pathlib import Path

import pytest

from devpool.compat import settings_fallback
from devpool.config import settings_from
from devpool.errors import DevpoolError
from devpool.plan.markers import request_for

KNOWN = ("sim",)


def fallback(pytester: pytest.Pytester, *args: str) -> dict[str, tuple[object, str]]:
    return settings_fallback(pytester.parseconfigure(*args))


def test_pytest_timeout_and_rerunfailures_options_are_read(pytester: pytest.Pytester) -> None:
    got = fallback(pytester, "--timeout", "7", "--reruns", "2", "--reruns-delay", "0.5")

    assert got == {
        "test-timeout": (7.0, "--timeout (pytest-timeout)"),
        "reruns": (2, "--reruns (pytest-rerunfailures)"),
        "reruns-delay": (0.5, "--reruns-delay (pytest-rerunfailures)"),
    }


def test_their_ini_values_and_pytest_timeout_env_are_read(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeini("[pytest]\ntimeout = 3\nreruns = 1\nreruns_delay = 2\n")
    got = fallback(pytester)
    assert got["test-timeout"] == ("3", "the `timeout` ini value (pytest-timeout)")
    assert got["reruns"] == ("1", "the `reruns` ini value (pytest-rerunfailures)")
    assert got["reruns-delay"] == ("2", "the `reruns_delay` ini value (pytest-rerunfailures)")

    monkeypatch.setenv("PYTEST_TIMEOUT", "9")
    assert fallback(pytester)["test-timeout"] == ("9", "PYTEST_TIMEOUT (pytest-timeout)")


def test_fail_on_flaky_makes_flaky_tests_gate(pytester: pytest.Pytester) -> None:
    got = fallback(pytester, "--fail-on-flaky")

    assert got == {"flaky-result": ("fail", "--fail-on-flaky (pytest-rerunfailures)")}


def test_force_reruns_wins_over_reruns_and_timeout_zero_is_no_limit(
    pytester: pytest.Pytester,
) -> None:
    got = fallback(pytester, "--reruns", "1", "--force-reruns", "4", "--timeout", "0")

    assert got == {"reruns": (4, "--force-reruns (pytest-rerunfailures)")}


def test_devpool_options_win_and_bad_values_name_the_plugin_option(tmp_path: Path) -> None:
    plugins = {"test-timeout": (7.0, "--timeout (pytest-timeout)")}
    options = {"devpool_test_timeout": "5"}
    assert settings_from(options, {}, "pyproject.toml", {}, plugins).test_timeout == 5.0
    table = {"test-timeout": 6}
    assert settings_from({}, table, "pyproject.toml", {}, plugins).test_timeout == 6.0
    assert settings_from({}, {}, "pyproject.toml", {}, plugins).test_timeout == 7.0

    bad = {"reruns-delay": (-1.0, "--reruns-delay (pytest-rerunfailures)")}
    with pytest.raises(DevpoolError) as info:
        settings_from({}, {}, "pyproject.toml", {}, bad)
    assert str(info.value) == (
        "--reruns-delay (pytest-rerunfailures) must be a number of seconds ≥ 0, got -1.0"
    )


FLAKY_TESTS = """
import pytest

@pytest.mark.flaky(reruns=3, reruns_delay=0.5)
def test_kw():
    pass

@pytest.mark.flaky(2)
def test_positional():
    pass

@pytest.mark.flaky
def test_bare():
    pass

@pytest.mark.flaky(reruns=5, condition=False)
def test_off():
    pass

@pytest.mark.flaky(reruns=5, condition="sys.platform == 'no-such-os'")
def test_off_by_string():
    pass

def test_unmarked():
    pass
"""


def test_flaky_marker_becomes_the_tests_own_reruns(pytester: pytest.Pytester) -> None:
    items = {item.name: item for item in pytester.getitems(FLAKY_TESTS)}
    got = {name: request_for(item, KNOWN) for name, item in items.items()}

    assert (got["test_kw"].reruns, got["test_kw"].reruns_delay) == (3, 0.5)
    assert (got["test_positional"].reruns, got["test_positional"].reruns_delay) == (2, 0.0)
    assert got["test_bare"].reruns == 1
    assert got["test_off"].reruns == 0
    assert got["test_off_by_string"].reruns == 0
    assert (got["test_unmarked"].reruns, got["test_unmarked"].reruns_delay) == (None, None)
    assert got["test_kw"].describe() == "cpu, reruns 3"


def test_flaky_marker_append_mode_and_force_reruns(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\naddopts = --reruns 1 --reruns-mode append\n")
    items = {item.name: item for item in pytester.getitems(FLAKY_TESTS)}
    assert request_for(items["test_kw"], KNOWN).reruns == 4

    pytester.makeini("[pytest]\naddopts = --force-reruns 1\n")
    items = {item.name: item for item in pytester.getitems(FLAKY_TESTS)}
    assert request_for(items["test_kw"], KNOWN).reruns is None  # the option, for every test


@pytest.mark.parametrize(
    ("mark", "words"),
    [
        ("flaky(reruns='2')", "@pytest.mark.flaky(reruns='2') needs a whole number ≥ 0"),
        ("flaky(reruns=-1)", "@pytest.mark.flaky(reruns=-1) needs a whole number ≥ 0"),
        ("flaky(reruns_delay='x')", "flaky(reruns_delay='x') needs a number of seconds"),
        ("flaky(condition='nope(')", "@pytest.mark.flaky(condition='nope(') failed"),
    ],
)
def test_bad_flaky_markers_name_the_test(pytester: pytest.Pytester, mark: str, words: str) -> None:
    item = pytester.getitem(f"import pytest\n@pytest.mark.{mark}\ndef test_func():\n    pass\n")
    with pytest.raises(DevpoolError) as info:
        request_for(item, KNOWN)
    assert str(info.value).startswith(f"{item.nodeid}: ")
    assert words in str(info.value)


def test_plan_shows_limits_and_reruns_from_the_plugins(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.flaky(reruns=3)
        def test_flaky():
            pass

        @pytest.mark.timeout(0)
        def test_unlimited():
            pass

        def test_default():
            pass
        """
    )
    result = pytester.runpytest(
        "--devices",
        "sim:0-1",
        f"--devpool-lock-dir={tmp_path}",
        "--devpool-plan",
        "--timeout",
        "7",
        "--only-rerun",
        "OSError",
        "-p",
        "no:cacheprovider",
    )
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines_random(
        [
            "*cpu, timeout 7s, reruns 3 *test_flaky*",
            "*cpu, no timeout *test_unlimited*",
            "*cpu, timeout 7s *test_default*",
            "devpool: --timeout (pytest-timeout) 7.0 is enforced by devpool*",
            "devpool: WARNING: --only-rerun (pytest-rerunfailures) not applied: *",
        ]
    )
