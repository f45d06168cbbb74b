"""Smaller things a reader sees: the not-run section's title, the automatic port in
--devpool-plan."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sessions import run


@pytest.fixture(autouse=True)
def _only_named_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)


def test_the_not_run_section_says_why_they_did_not_run(
    pytester: pytest.Pytester, lock: Path
) -> None:
    body = "def test_first():\n    assert False\n\n" + "".join(
        f"def test_later_{i}():\n    pass\n\n" for i in range(4)
    )
    pytester.makepyfile(test_stop=body)

    result = run(
        pytester, lock, "--devices=sim:0", "--devpool-cpu-slots=1", "-x", "-p", "no:randomly"
    )

    titles = [line for line in result.outlines if re.search(r"devpool: \d+ tests? not run", line)]
    assert len(titles) == 1, result.outlines
    assert "not run (the run ended before they started)" in titles[0]
    assert "(not run)" not in titles[0]


def test_the_plan_lists_the_automatic_port_of_a_test_of_two_devices(
    pytester: pytest.Pytester, lock: Path
) -> None:
    pytester.makepyfile(
        test_ports="""
        import pytest

        @pytest.mark.device_count(2)
        def test_pair():
            pass

        @pytest.mark.device_count(1)
        def test_one():
            pass

        @pytest.mark.device_count(2)
        @pytest.mark.ports(3)
        def test_own_ports():
            pass
        """
    )

    result = run(pytester, lock, "--devices=sim:0-3", "--devpool-plan")

    planned = {line.split()[-1]: line for line in result.outlines if "::test_" in line}
    assert "2 devices, 1 port (auto)" in planned["test_ports.py::test_pair"]
    assert "1 device  " in planned["test_ports.py::test_one"]
    assert " port" not in planned["test_ports.py::test_one"]
    assert "3 ports" in planned["test_ports.py::test_own_ports"]
    assert "(auto)" not in planned["test_ports.py::test_own_ports"]
