"""The end of a run as the user sees it: status letters, devpool's part of the terminal
summary, and the attempts folded into --junitxml."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import pytest

from devpool.devices.inventory import Inventory
from devpool.history.quarantine import Entry
from devpool.outcomes import RERUN, Outcome
from devpool.report.github import GitHubLog
from devpool.report.junit import EarlierAttempt, fold_attempts
from devpool.report.record import LiveRecord, RecordWriter
from devpool.report.summary import INTERRUPTED, summarize
from devpool.report.terminal import print_repeats, print_summary
from devpool.session.past_runs import RELEASE_AFTER


class Findings(Protocol):
    """What the controller found during the run, for its summary."""

    config: pytest.Config
    inventory: Inventory
    repeats: dict[str, list[tuple[Outcome, str]]]
    quarantined: dict[str, Entry]
    quarantine_notes: list[str]
    live_record: LiveRecord
    releasable: list[str]
    bad_devices: dict[int, str]
    device_notes: list[str]
    run_notes: list[str]
    deselected: list[tuple[str, str]]
    github: GitHubLog | None
    record: RecordWriter | None
    record_path: Path


def deselected_count(config: pytest.Config) -> int:
    """The tests pytest's closing line counts as deselected (-k, -m, devpool's own)."""
    terminal = config.pluginmanager.get_plugin("terminalreporter")
    stats = getattr(terminal, "stats", None)
    return len(stats.get("deselected", ())) if isinstance(stats, dict) else 0


def teststatus(report: pytest.TestReport) -> tuple[str, str, tuple[str, Mapping[str, bool]]] | None:
    """The status letter and word of devpool's own endings; None leaves the report to pytest."""
    outcome = getattr(report, "devpool_outcome", None)
    if outcome in (Outcome.TIMEOUT, Outcome.CRASHED, Outcome.INFRA) and report.failed:
        word = str(outcome).upper()
        return outcome, word[0], (word, {"red": True})
    if outcome == RERUN:
        return "rerun", "R", ("RERUN", {"yellow": True})
    if getattr(report, "devpool_quarantined", False):
        return "quarantined", "Q", ("QUARANTINED", {"yellow": True})
    if outcome == Outcome.FLAKY and report.when == "call":
        return "flaky", "K", ("FLAKY", {"red": report.failed, "yellow": not report.failed})
    return None


def write_summary(terminalreporter: Any, found: Findings) -> None:
    """Notes, quarantined failures, retired devices, deselections, then the summary itself:
    the run's one summary (report.summary), read from the record as it was written."""
    run = summarize(found.live_record.record)
    for note in found.quarantine_notes:
        terminalreporter.write_line(f"devpool: WARNING: {note}", red=True, bold=True)
    for nodeid in found.releasable:
        terminalreporter.write_line(
            f"devpool: {nodeid} is quarantined but passed its last {RELEASE_AFTER} runs: "
            "ready to release"
        )
    for device, why in found.bad_devices.items():
        terminalreporter.write_line(
            f"devpool: device {found.inventory.platform.name}:{device} retired: {why}",
            red=True,
            bold=True,
        )
    for note in found.device_notes:
        terminalreporter.write_line(f"devpool: device {note}", yellow=True)
    for note in found.run_notes:
        terminalreporter.write_line(f"devpool: {note}", yellow=True)
    if found.deselected:
        terminalreporter.write_sep("-", f"devpool: {len(found.deselected)} deselected")
        for nodeid, reason in found.deselected:
            terminalreporter.write_line(f"{nodeid}: {reason}")
    if found.github is not None:
        terminalreporter.write_line(found.github.close_fence())
        for line in found.github.groups():
            terminalreporter.write_line(line)
    # The summary stays outside every group: it is what a reader of a collapsed log sees.
    print_repeats(terminalreporter, found.repeats)
    print_summary(terminalreporter, run, found.config.invocation_params.dir)
    if found.github is not None:
        for line in found.github.annotations(run):
            terminalreporter.write_line(line)
    if found.record is not None:
        terminalreporter.write_line(f"devpool: run record {found.record_path}")
    # pytest's closing line, written next, counts what ended; the tests an interrupt cut
    # count there too, as every report form counts them ("1 failed, 1 interrupted").
    cut = [Cut(nodeid) for nodeid in run.tests.get(INTERRUPTED, ())]
    if cut:
        terminalreporter._add_stats(INTERRUPTED, cut)


class Cut:
    """A test that was running when the run was interrupted, for pytest's closing line."""

    count_towards_summary = True

    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid


def fold_junit(
    config: pytest.Config, retried: Mapping[str, list[EarlierAttempt]], collected: Sequence[str]
) -> None:
    """--junitxml: fold the attempts of tests run again into their testcase, and put the
    testcases in collection order, as plain pytest writes them (report.junit)."""
    xmlpath = getattr(config.option, "xmlpath", None)
    if xmlpath and os.path.exists(xmlpath):
        prefix = getattr(config.option, "junitprefix", None)
        order = [_junit_key(nodeid, prefix) for nodeid in collected]
        keys = {_junit_key(nodeid, prefix): attempts for nodeid, attempts in retried.items()}
        fold_attempts(Path(xmlpath), keys, order)


def _junit_key(nodeid: str, prefix: str | None) -> tuple[str, str]:
    """(classname, name) as pytest's junitxml derives them from a node id."""
    from _pytest.junitxml import mangle_test_address

    names = mangle_test_address(nodeid)
    if prefix:
        names[0] = f"{prefix}.{names[0]}"
    return ".".join(names[:-1]), names[-1]
