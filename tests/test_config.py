"""Unit tests for devpool.config: merging command line, [tool.devpool] and defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from devpool.config import OPTIONS, TABLE_KEYS, Settings, read_table, settings_from
from devpool.devices.inventory import BUILTIN_PLATFORMS, Platform
from devpool.errors import DevpoolError

WHERE = "/repo/pyproject.toml"


def merged(options: dict[str, Any] | None = None, **table: Any) -> Settings:
    return settings_from(options or {}, {k.replace("_", "-"): v for k, v in table.items()}, WHERE)


def failure(options: dict[str, Any] | None = None, **table: Any) -> str:
    with pytest.raises(DevpoolError) as info:
        merged(options, **table)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_defaults_when_nothing_is_given(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # CPU slots: the cores this process may use (its affinity, here no cgroup quota), not
    # the host's count.
    monkeypatch.setattr("os.cpu_count", lambda: 64)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(6)))
    monkeypatch.setenv("DEVPOOL_CGROUP_ROOT", str(tmp_path))

    settings = merged()

    assert settings.devices is None
    assert settings.platforms == BUILTIN_PLATFORMS
    assert settings.max_parallel is None
    assert settings.cpu_slots == 6
    assert (settings.lease_timeout, settings.test_timeout, settings.timeout_grace) == (
        600.0,
        None,
        5.0,
    )
    assert (settings.skip_unsatisfiable, settings.plan, settings.isolation) == (
        False,
        False,
        "worker",
    )
    assert settings.run_dir is None
    assert isinstance(settings.lock_dir, Path)


def test_table_values_are_converted() -> None:
    settings = merged(
        devices="sim:0-3",
        max_parallel=4,
        cpu_slots="3",
        lock_dir="~/locks",
        lease_timeout=30,
        test_timeout="2.5",
        timeout_grace=1,
        skip_unsatisfiable=True,
        plan=False,
        isolation="job",
        run_dir="runs",
    )

    assert settings.devices == "sim:0-3"
    assert (settings.max_parallel, settings.cpu_slots) == (4, 3)
    assert settings.lock_dir == Path("~/locks").expanduser()
    assert "~" not in str(settings.lock_dir)
    assert (settings.lease_timeout, settings.test_timeout, settings.timeout_grace) == (
        30.0,
        2.5,
        1.0,
    )
    assert (settings.skip_unsatisfiable, settings.plan, settings.isolation) == (True, False, "job")
    assert settings.run_dir == Path("runs")


def test_command_line_wins_over_the_table_and_none_means_not_given() -> None:
    options = {
        "devpool_devices": "cuda:0",
        "devpool_max_parallel": "2",
        "devpool_lease_timeout": None,
        "devpool_plan": True,
        "devpool_isolation": None,
    }

    settings = merged(
        options, devices="sim:0-7", max_parallel=8, lease_timeout=9, plan=False, isolation="job"
    )

    assert settings.devices == "cuda:0"
    assert settings.max_parallel == 2
    assert settings.lease_timeout == 9.0  # not on the command line: the table's value
    assert settings.plan is True
    assert settings.isolation == "job"


def test_every_option_has_a_command_line_spelling_and_a_table_key() -> None:
    for option in OPTIONS:
        assert option.cli == "--devpool-" + option.name
        assert option.dest == "devpool_" + option.name.replace("-", "_")
        assert option.name in TABLE_KEYS
    assert {"devices", "platforms"} <= TABLE_KEYS


@pytest.mark.parametrize(
    ("key", "value", "must_be"),
    [
        ("max-parallel", 0, "a whole number ≥ 1, got 0"),
        ("max-parallel", "two", "a whole number ≥ 1, got 'two'"),
        ("max-parallel", 2.5, "a whole number ≥ 1, got 2.5"),
        ("cpu-slots", True, "a whole number ≥ 1, got True"),
        ("cpu-slots", -3, "a whole number ≥ 1, got -3"),
        ("lease-timeout", 0, "a number of seconds > 0, got 0"),
        ("test-timeout", "soon", "a number of seconds > 0, got 'soon'"),
        ("timeout-grace", -1.0, "a number of seconds > 0, got -1.0"),
        ("timeout-grace", False, "a number of seconds > 0, got False"),
        ("lease-timeout", "nan", "a number of seconds > 0, got 'nan'"),
        ("skip-unsatisfiable", "yes", "true or false, got 'yes'"),
        ("plan", 1, "true or false, got 1"),
        ("lock-dir", "", "a non-empty string, got ''"),
        ("run-dir", 3, "a non-empty string, got 3"),
        (
            "isolation",
            "process",
            "'worker' (warm reuse), 'module' (a fresh process per test module) "
            "or 'job' (a fresh process per test), got 'process'",
        ),
    ],
)
def test_each_converter_names_the_table_key_and_what_it_must_be(
    key: str, value: object, must_be: str
) -> None:
    message = failure(**{key: value})

    assert message == f"{WHERE}: [tool.devpool] {key} must be {must_be}"


def test_a_bad_command_line_value_names_the_option() -> None:
    message = failure({"devpool_max_parallel": "0"}, max_parallel=4)

    assert message == "--devpool-max-parallel must be a whole number ≥ 1, got '0'"


def test_unknown_key_is_named_with_the_known_ones() -> None:
    message = failure(max_parallel=2, speed=2)

    assert message.startswith(f"{WHERE}: [tool.devpool] has unknown key 'speed'; known keys: ")
    assert "max-parallel" in message
    assert "platforms" in message


def test_a_misspelt_key_gets_the_close_one() -> None:
    assert failure(parallel=2).endswith("unknown key 'parallel'; did you mean max-parallel?")
    assert failure(max_paralel=2).endswith("did you mean max-parallel?")
    with pytest.raises(DevpoolError, match="did you mean max-parallel"):
        settings_from({}, {"max_parallel": 2}, WHERE)  # the key as a user wrote it


def test_devices_in_the_table_must_be_text() -> None:
    message = failure(devices=[0, 1])

    assert message == f"{WHERE}: [tool.devpool] devices must be a string like 'sim:0-7'"


def test_platforms_table_passes_through_to_load_platforms() -> None:
    settings = merged(
        platforms={"a2a3": "ascend", "a2a3sim": {"kind": "sim", "visible-env": False}}
    )

    assert settings.platforms["a2a3"] == Platform(
        "a2a3", "ascend", "ASCEND_RT_VISIBLE_DEVICES", "NPU"
    )
    assert settings.platforms["a2a3sim"] == Platform("a2a3sim", "sim", None, "SIM")
    assert settings.platforms["cuda"] == BUILTIN_PLATFORMS["cuda"]


def test_platforms_must_be_a_table() -> None:
    assert failure(platforms="ascend") == f"{WHERE}: [tool.devpool] platforms must be a table"


def test_platforms_errors_come_from_load_platforms() -> None:
    assert "unknown kind 'tpu'" in failure(platforms={"x": "tpu"})


def test_read_table_returns_the_devpool_table(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[project]\nname = "x"\n\n[tool.devpool]\ndevices = "sim:0-3"\n'
        '\n[tool.devpool.platforms]\na2a3 = "ascend"\n',
        encoding="utf-8",
    )

    assert read_table(pyproject) == {"devices": "sim:0-3", "platforms": {"a2a3": "ascend"}}


def test_read_table_without_a_file_or_a_table_is_empty(tmp_path: Path) -> None:
    assert read_table(None) == {}
    assert read_table(tmp_path / "missing.toml") == {}
    (tmp_path / "pyproject.toml").write_text("[tool.ruff]\nline-length = 100\n")
    assert read_table(tmp_path / "pyproject.toml") == {}


def test_read_table_names_the_file_when_toml_is_invalid(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text("[tool.devpool\ndevices = ", encoding="utf-8")

    with pytest.raises(DevpoolError) as info:
        read_table(pyproject)

    assert str(info.value).startswith(f"{pyproject} is not valid TOML: ")


def test_read_table_rejects_a_devpool_value_that_is_not_a_table(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[tool]\ndevpool = "sim:0-7"\n', encoding="utf-8")

    with pytest.raises(DevpoolError, match=r"\[tool.devpool\] must be a table$"):
        read_table(pyproject)


PROFILES = {
    "max-parallel": 8,
    "profiles": {
        "ci": {"reruns": 2, "max-parallel": 4, "github": True},
        "nightly": {"repeat": 20},
    },
}


def test_a_profile_lays_its_keys_over_the_table() -> None:
    settings = settings_from({"devpool_profile": "nightly"}, PROFILES, "pyproject.toml", {})
    assert settings.repeat == 20
    assert settings.max_parallel == 8  # from the table, untouched by the profile


def test_the_ci_profile_applies_by_itself_under_ci_and_the_command_line_still_wins() -> None:
    settings = settings_from({}, PROFILES, "pyproject.toml", {"CI": "true"})
    assert (settings.reruns, settings.max_parallel, settings.github) == (2, 4, True)
    assert settings_from({}, PROFILES, "pyproject.toml", {}).reruns == 0
    cli = {"devpool_max_parallel": "3"}
    assert settings_from(cli, PROFILES, "pyproject.toml", {"CI": "true"}).max_parallel == 3


def test_unknown_profiles_and_profile_keys_are_one_sentence_each() -> None:
    with pytest.raises(DevpoolError, match=r"--devpool-profile 'weekly' is not in .*nightly"):
        settings_from({"devpool_profile": "weekly"}, PROFILES, "pyproject.toml", {})
    bad = {"profiles": {"ci": {"rerunz": 1}}}
    with pytest.raises(
        DevpoolError, match=r"\[tool.devpool.profiles.ci\] has unknown key 'rerunz'"
    ):
        settings_from({}, bad, "pyproject.toml", {"CI": "true"})
    with pytest.raises(DevpoolError, match="one table per profile"):
        settings_from({}, {"profiles": {"ci": 3}}, "pyproject.toml", {})
