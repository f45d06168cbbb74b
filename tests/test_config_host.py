"""[tool.devpool] ports and [tool.devpool.resources]: defaults, conversion, refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from devpool.config import settings_from
from devpool.devices import ports
from devpool.errors import DevpoolError


def test_defaults_are_the_documented_range_and_no_resources() -> None:
    settings = settings_from({}, {}, "pyproject.toml", environ={})
    assert settings.ports == (20000, 29999)
    assert settings.resources == {}


def test_ports_and_resources_from_the_table() -> None:
    table = {"ports": "21000-21099", "resources": {"hccl": 1, "license": 4}}
    settings = settings_from({}, table, "pyproject.toml", environ={})
    assert settings.ports == (21000, 21099)
    assert settings.resources == {"hccl": 1, "license": 4}


def test_a_range_overlapping_the_ephemeral_one_is_refused_in_one_sentence(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = tmp_path / "ip_local_port_range"
    fake.write_text("32768 60999\n")
    monkeypatch.setattr(ports, "EPHEMERAL_FILE", fake)
    with pytest.raises(DevpoolError) as info:
        settings_from({"devpool_ports": "30000-40000"}, {}, "pyproject.toml", environ={})
    message = str(info.value)
    assert "overlaps the kernel's ephemeral port range 32768-60999" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("table", "words"),
    [
        ({"ports": "20000"}, "ports must be a range of TCP ports"),
        ({"resources": {"hccl": 0}}, "hccl must be a whole number ≥ 1"),
        ({"resources": 3}, "must be a table of name = capacity"),
    ],
)
def test_bad_values_name_the_key(table: dict[str, object], words: str) -> None:
    with pytest.raises(DevpoolError, match=words):
        settings_from({}, table, "pyproject.toml", environ={})
