"""Collect a suite for the capacity report (run nothing): each test's request, platforms,
and whether it is disabled or quarantined."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from devpool.config import add_options, read_table, settings_from, unknown_option
from devpool.devices.inventory import Platform, load_platforms
from devpool.devices.resources import parse_resources
from devpool.errors import DevpoolError
from devpool.history.quarantine import (
    Entry,
    entries_from_file,
    entries_from_table,
    entry_from_marker,
)
from devpool.plan import rules as path_rules
from devpool.plan.markers import MARKERS, Request, request_for
from devpool.plan.once import OnceFixture, marked_on, parse_once


@dataclass
class CollectedTest:
    """One collected test's request and state, read from its markers."""

    nodeid: str
    device_count: int
    nodes: int
    platforms: tuple[str, ...] | None
    quarantined: bool
    disabled: bool
    device_memory: int | None = None  # bytes per device, declared or the suite's default
    resources: tuple[tuple[str, int], ...] = ()  # resources(name=k): named host resources
    ranks: int = 0  # ranks(n): n processes, devices_per_rank devices each
    devices_per_rank: int = 1
    once: tuple[str, ...] = ()  # the [tool.devpool.once] fixtures it uses

    @property
    def request(self) -> Request:
        return Request(
            self.device_count,
            self.platforms,
            self.nodes,
            device_memory=self.device_memory,
            ranks=self.ranks,
            devices_per_rank=self.devices_per_rank,
        )


@dataclass
class Collection:
    """What collect() saw: the tests, the project's platforms and its [tool.devpool] table."""

    tests: list[CollectedTest] = field(default_factory=list)
    platforms: dict[str, Platform] = field(default_factory=dict)
    table: dict[str, Any] = field(default_factory=dict)
    quarantine: list[Entry] = field(default_factory=list)  # [tool.devpool.quarantine] + file
    devices: str | None = None  # --devices after `--`, else [tool.devpool] devices (profile)
    device_memory: int | None = None  # [tool.devpool] device-memory (profile)
    memory_reserve: float = 0.05  # [tool.devpool] memory-reserve (profile)
    error: DevpoolError | None = None
    # [tool.devpool.paths] / [tool.devpool.markers] (plan/rules.py): per test, where each
    # part of its request came from; the path keys that covered no test; each test's
    # file and line, as pytest located it.
    rules: path_rules.Rules = field(default_factory=path_rules.Rules)
    sources: dict[str, dict[str, str]] = field(default_factory=dict)
    unmatched: list[str] = field(default_factory=list)
    locations: dict[str, tuple[Path, int | None]] = field(default_factory=dict)
    once: tuple[OnceFixture, ...] = ()  # [tool.devpool.once]


def _pyproject(config: pytest.Config) -> Path:
    if config.inipath is not None and config.inipath.name == "pyproject.toml":
        return config.inipath
    return config.rootpath / "pyproject.toml"


def _disabled(item: pytest.Item) -> bool:
    from _pytest.skipping import evaluate_skip_marks

    try:
        return evaluate_skip_marks(item) is not None
    except (Exception, pytest.fail.Exception) as exc:
        raise DevpoolError(
            f"{item.nodeid}: cannot evaluate its skip/skipif marker: {exc}"
        ) from None


class _Collector:
    """A pytest plugin that reads each collected item's markers and keeps nothing else."""

    def __init__(self) -> None:
        self.seen = Collection()

    def pytest_addoption(self, parser: pytest.Parser) -> None:
        # devpool's own plugin is off while collecting, yet `-- PATHS --devices sim:0-7
        # --devpool-…` must parse as in a run: they are read, and nothing starts.
        add_options(parser)

    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config: pytest.Config) -> None:
        for text in MARKERS.values():
            config.addinivalue_line("markers", text)
        pyproject = _pyproject(config)
        try:
            table = read_table(pyproject)
            settings = settings_from(vars(config.option), table, str(pyproject))
            self.seen.devices = settings.devices
            self.seen.device_memory = settings.device_memory
            self.seen.memory_reserve = settings.memory_reserve
            self.seen.rules = path_rules.rules_from(table, str(pyproject), settings)
            for key in ("platforms", "quarantine"):
                if not isinstance(table.get(key, {}), dict):
                    raise DevpoolError(f"{pyproject}: [tool.devpool] {key} must be a table")
            self.seen.table = table
            self.seen.platforms = load_platforms(table.get("platforms"))
            self.seen.once = parse_once(
                table, str(pyproject), settings.platforms, settings.resources
            )
            self.seen.quarantine = entries_from_table(
                table.get("quarantine", {}), "[tool.devpool.quarantine]"
            )
            file = table.get("quarantine-file")
            if isinstance(file, str) and file:
                path = Path(file).expanduser()
                self.seen.quarantine += entries_from_file(
                    path if path.is_absolute() else config.rootpath / path
                )
        except DevpoolError as exc:
            self.seen.error = exc

    @pytest.hookimpl(trylast=True)  # after -k/-m and other plugins have deselected
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        if self.seen.error is not None:
            return
        try:
            self.seen.sources = path_rules.apply(items, self.seen.rules, config.rootpath)
            self.seen.unmatched = path_rules.unmatched(self.seen.rules, items, config.rootpath)
            for item in items:
                self.seen.locations[item.nodeid] = (Path(str(item.path)), item.location[1])
                fixtures = getattr(item, "fixturenames", ())
                self._marked_once(item, config.rootpath)
                request = request_for(
                    item, self.seen.platforms, self.seen.device_memory, self._resources()
                )
                self.seen.tests.append(
                    CollectedTest(
                        item.nodeid,
                        request.device_count,
                        request.nodes,
                        request.platforms,
                        quarantined=entry_from_marker(item) is not None,
                        disabled=_disabled(item),
                        device_memory=request.device_memory,
                        resources=request.resources,
                        ranks=request.ranks,
                        devices_per_rank=request.devices_per_rank,
                        once=tuple(f.name for f in self.seen.once if f.name in fixtures),
                    )
                )
        except DevpoolError as exc:
            self.seen.error = exc

    def _marked_once(self, item: pytest.Item, root: Path) -> None:
        """The once-fixtures @devpool.once marked that this test uses, with the table's."""
        known = {fixture.name for fixture in self.seen.once}
        platforms, resources = list(self.seen.platforms), self._resources()
        self.seen.once += marked_on(item, known, root, platforms, resources)

    def _resources(self) -> dict[str, int]:
        """[tool.devpool.resources], so resources(name=k) markers read as a run reads them."""
        table = self.seen.table.get("resources")
        try:
            return parse_resources(table, "pyproject.toml") if table is not None else {}
        except ValueError as exc:
            raise DevpoolError(str(exc)) from None


def collect_suite(args: Sequence[str]) -> Collection:
    """Collect with pytest in this process (devpool's own plugin off) and read every marker."""
    wrong = unknown_option(args)
    if wrong is not None:
        raise DevpoolError(wrong)
    collector = _Collector()
    out = io.StringIO()
    argv = ["--collect-only", "-q", "-p", "no:devpool", *args]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = pytest.main(argv, plugins=[collector])
    if collector.seen.error is not None:
        raise collector.seen.error
    if code not in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        lines = [line for line in out.getvalue().splitlines() if line.strip()]
        why = next((line for line in lines if " error: " in line), None)  # argparse's
        why = why or next((line for line in lines if line.startswith(("ERROR", "E "))), None)
        why = why or (lines[-1] if lines else f"exit status {int(code)}")
        raise DevpoolError(
            f"pytest could not collect {' '.join(args) or 'the suite'}: {why.strip()} "
            "(run python -m pytest --collect-only to see it all)"
        )
    return collector.seen


def collect(args: Sequence[str]) -> list[CollectedTest]:
    """The suite's tests and their requests, as `pytest --collect-only ARGS` sees them."""
    return collect_suite(args).tests


def apply_quarantine(
    tests: Sequence[CollectedTest], entries: Sequence[Entry], platform: str, kind: str
) -> None:
    """Mark the tests a quarantine table or file entry covers on this platform."""
    for test in tests:
        if not test.quarantined:
            test.quarantined = any(e.covers(test.nodeid, platform, kind) for e in entries)


# --- the report ----------------------------------------------------------------------------
