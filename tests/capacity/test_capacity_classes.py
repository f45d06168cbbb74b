"""`devpool capacity --classes` and `devpool shard --classes`: a fleet's class mix (issue 56)."""

from __future__ import annotations

import json
import textwrap

import pytest

from devpool.cli import main


def test_device_hours_and_shards_per_class(
    pytester: pytest.Pytester, capsys: pytest.CaptureFixture[str]
) -> None:
    pytester.makepyprojecttoml('[tool.devpool.platforms]\nh100 = "sim"\nh200 = "sim"\nb200 = "sim"')
    pytester.makepyfile(
        test_mix=textwrap.dedent(
            """
            import pytest

            @pytest.mark.platforms(["h100"])
            @pytest.mark.device_count(2)
            @pytest.mark.parametrize("i", range(3))
            def test_h100(i): pass

            @pytest.mark.platforms(["h200"])
            @pytest.mark.device_count(1)
            def test_h200(): pass

            @pytest.mark.platforms(["b200"])
            def test_b200(): pass

            @pytest.mark.device_count(1)
            def test_any(): pass
            """
        )
    )
    suite = [str(pytester.path), "--", "-p", "no:hypothesispytest", "-p", "no:randomly"]
    assert main(["capacity", "--classes", "h100,h200", "--format", "json", *suite]) == 0
    data = json.loads(capsys.readouterr().out)
    # default estimate 1 s: h100 runs 3 two-device tests and the any-device one: 7 device-s
    assert data["classes"] == [
        {"platform": "h100", "tests": 4, "own_tests": 3, "device_hours": round(7 / 3600, 4),
         "estimates_at_default": 4},
        {"platform": "h200", "tests": 2, "own_tests": 1, "device_hours": round(2 / 3600, 4),
         "estimates_at_default": 2},
    ]  # fmt: skip
    assert data["uncovered"] == ["test_mix.py::test_b200"]
    assert main(["capacity", "--classes", "h100,h200", *suite]) == 0
    text = capsys.readouterr().out
    assert "1 test no class of the mix runs (e.g. test_mix.py::test_b200)" in text
    assert main(["shard", "--classes", "h100,h200", "--runners", "2", *suite]) == 0
    text = capsys.readouterr().out
    assert "== class h100" in text and "== class h200" in text
    assert (
        "devpool shard: 4 tests in 2 shards" in text
        and "devpool shard: 2 tests in 2 shards" in text
    )
    assert main(["capacity", "--classes", " , ", *suite]) == 4
    assert "--classes needs platform names" in capsys.readouterr().err
    assert main(["capacity", "--classes", "h300", *suite]) == 4
    assert "--classes names unknown platform 'h300'" in capsys.readouterr().err
