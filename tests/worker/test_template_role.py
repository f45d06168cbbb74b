"""TemplateRole.check (worker/template_role.py): a template refuses, naming why and the
module, when collection initialised a device runtime or failed; else it notes the first
test module whose import started native threads. The runtime probe, the thread count, the
fork server and os._exit are fakes: nothing forks and the test process never exits."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from devpool.worker import template_role
from devpool.worker.template_role import TemplateRole


class Exited(Exception):
    pass


class Server:
    def __init__(self) -> None:
        self.refused: list[tuple[str, str | None]] = []

    def refuse(self, why: str, module: str | None = None) -> None:
        self.refused.append((why, module))


class Probes:
    def __init__(self) -> None:
        self.runtime: str | None = None
        self.threads = 1


@pytest.fixture
def probes(monkeypatch: pytest.MonkeyPatch) -> Probes:
    probes = Probes()
    monkeypatch.setattr(template_role.forkserver, "initialised_runtime", lambda c: probes.runtime)
    monkeypatch.setattr(template_role.native_threads, "thread_count", lambda: probes.threads)

    def exit_(code: int) -> None:
        raise Exited(code)

    monkeypatch.setattr(template_role.os, "_exit", exit_)
    return probes


def _role(tmp_path: Path) -> tuple[TemplateRole, Server]:
    server = Server()
    config: Any = SimpleNamespace(rootpath=tmp_path)
    return TemplateRole(config, server), server  # type: ignore[arg-type]


def _report(nodeid: str, outcome: str = "passed") -> pytest.CollectReport:
    return pytest.CollectReport(nodeid, outcome, None, [])


def test_a_runtime_initialised_at_import_ends_the_template_naming_the_module(
    tmp_path: Path, probes: Probes
) -> None:
    role, server = _role(tmp_path)
    probes.runtime = "CUDA (torch)"
    with pytest.raises(Exited):
        role.check(_report("tests/test_gpu.py"))
    assert server.refused == [
        (
            "importing tests/test_gpu.py initialised CUDA (torch)",
            os.path.normpath(tmp_path / "tests/test_gpu.py"),
        )
    ]


def test_a_failed_collection_ends_the_template_and_conftests_are_named_as_such(
    tmp_path: Path, probes: Probes
) -> None:
    role, server = _role(tmp_path)
    with pytest.raises(Exited):
        role.check(_report("", outcome="failed"))
    assert server.refused == [("collecting the conftest files failed in the template", None)]


def test_the_first_module_that_started_threads_is_the_culprit(
    tmp_path: Path, probes: Probes
) -> None:
    role, server = _role(tmp_path)
    role.check(_report("tests/test_a.py"))
    assert role.culprit is None
    probes.threads = 5  # an OpenMP pool started while importing test_b
    role.check(_report("tests/test_b.py::test_x"))  # an item, not a module: not looked at
    assert role.culprit is None
    role.check(_report("tests/test_b.py"))
    assert role.culprit == os.path.normpath(tmp_path / "tests/test_b.py")
    probes.threads = 9
    role.check(_report("tests/test_c.py"))
    assert role.culprit == os.path.normpath(tmp_path / "tests/test_b.py")  # the first only
    assert server.refused == []
