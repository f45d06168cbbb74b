"""`devpool rerun RUN`: run again the tests that did not pass in a run (nextest's `-R`).

RUN is a run folder (downloaded from CI, say) or its record.jsonl, `latest` (the newest
run here), or, with a PostgreSQL history, a queue run's id. The tests that did not pass
are those whose final attempt failed, errored, timed out, crashed or could not run, and
those the run never ended (cut, or left by -x). They run through `devpool run`, with the
run's own pytest arguments unless others follow `--`; the run's new record is the next
rerun's `latest`, so reruns converge on what still fails.

The tests reach the pytest session as a file named by DEVPOOL_RERUN, read by this module
as a plugin (`-p devpool.session.rerun`): the rest are deselected, as pytest's `-k` does.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devpool.errors import DevpoolError
from devpool.outcomes import GATING
from devpool.wording import counted

if TYPE_CHECKING:
    import pytest

RERUN_ENV = "DEVPOOL_RERUN"
PLUGIN = "devpool.session.rerun"
_NOT_PASSED = frozenset(outcome.value for outcome in GATING)
# Arguments that belong to the one run they were given to: where its record went, its part
# of a shard or a queue, its selection. A rerun is a run of its own.
_PER_RUN = (
    "--devpool-run-record",
    "--devpool-run-dir",
    "--devpool-shard",
    "--devpool-queue",
    "--devpool-queue-run",
    "--devpool-select",
)
RUN_FORMS = (
    "a run folder, its record.jsonl, `latest`, or a queue run's id with a PostgreSQL history"
)


@dataclass
class NotPassed:
    """The tests of one run that did not pass, and what the run was."""

    name: str  # the run as a sentence names it
    tests: list[str] = field(default_factory=list)  # node ids, in the run's order
    outcomes: Counter[str] = field(default_factory=Counter)  # outcome → tests ("not run")
    args: list[str] | None = None  # the run's own pytest arguments (None: unknown)

    def sentence(self) -> str:
        parts = ", ".join(f"{n} {outcome}" for outcome, n in self.outcomes.items())
        return f"{counted(len(self.tests), 'test')} of {self.name} did not pass ({parts})"


def add_rerun_command(commands: argparse._SubParsersAction[Any]) -> None:
    """`devpool rerun`, under the `devpool` parser."""
    what = (
        "run again the tests that did not pass in a run (failed, error, timeout, crashed, "
        "infra, or never ended)"
    )
    rerun = commands.add_parser(
        "rerun",
        help=what,
        usage="devpool rerun [-h] [--devpool-history URL] RUN [-- PYTEST_ARGS...]",
        description=what[0].upper() + what[1:] + ", under `devpool run`: with the run's own "
        "pytest arguments (less its record, run folder, shard, queue and selection), or with "
        "those that follow --.",
    )
    rerun.add_argument(
        "run",
        metavar="RUN",
        help="a run folder or its record.jsonl (downloaded from CI, say), `latest` (the newest "
        "under .devpool/runs here), or a queue run's id with a PostgreSQL history",
    )
    rerun.add_argument(
        "--devpool-history",
        dest="history",
        metavar="URL",
        help="the fleet's PostgreSQL history where queue runs live (default: [tool.devpool] "
        "history where it is a URL)",
    )
    # What follows `--` (cli.parse): pytest's arguments, else those the run was given,
    # without its record, run folder, shard, queue and selection.
    rerun.set_defaults(func=rerun_command, pytest_args=[])


def rerun_command(args: argparse.Namespace) -> int:
    """Find what did not pass in RUN, and run it under `devpool run`."""
    from devpool.session.runner import run_pytest

    found = not_passed(args.run, args.history)
    if not found.tests:
        print(f"devpool rerun: every test of {found.name} passed: nothing to rerun")
        return 0
    pytest_args = list(args.pytest_args) or own_arguments(found.args or [])
    print(f"devpool rerun: {found.sentence()}: running them again", flush=True)
    with tempfile.TemporaryDirectory(prefix="devpool-rerun-") as folder:
        listed = Path(folder) / "tests"
        listed.write_text("".join(f"{test}\n" for test in found.tests), encoding="utf-8")
        os.environ[RERUN_ENV] = str(listed)
        try:
            return run_pytest([*pytest_args, "-p", PLUGIN], None, None)
        finally:
            os.environ.pop(RERUN_ENV, None)


def own_arguments(args: list[str]) -> list[str]:
    """A run's pytest arguments, less those that belonged to that run alone (_PER_RUN)."""
    kept: list[str] = []
    skip_value = False
    for index, arg in enumerate(args):
        if skip_value:
            skip_value = False
            continue
        name = arg.split("=", 1)[0]
        if name in _PER_RUN:
            skip_value = "=" not in arg
            continue
        if arg == "-p" and args[index + 1 : index + 2] == [PLUGIN]:
            skip_value = True  # the rerun that made this run: its own plugin comes again
            continue
        kept.append(arg)
    return kept


def not_passed(run: str, history: str | None) -> NotPassed:
    """The tests of RUN that did not pass; DevpoolError in one sentence for a bad RUN."""
    from devpool.report.record import latest_record, read_run

    if run == "latest":
        path = latest_record(Path.cwd())
        if path is None:
            raise DevpoolError("devpool rerun latest: no run under .devpool/runs here")
    else:
        path = Path(run)
    if path.exists():
        record = read_run(path)
        if record.damage:
            print(f"devpool: {record.damage}", file=sys.stderr)
        return _of_record(record, f"run {record.start.get('run_id') or path}")
    url = _history_url(history)
    if url is None:
        raise DevpoolError(f"no run folder or record at {run!r} (RUN is {RUN_FORMS})")
    return _of_queue(url, run)


def _of_record(record: Any, name: str) -> NotPassed:
    found = NotPassed(name, args=[str(a) for a in record.start.get("args", [])])
    ended: dict[str, Any] = {}
    for job in record.final_attempts():
        ended[job.nodeid] = job
    for job in ended.values():
        if job.outcome in _NOT_PASSED and job.test_id not in found.tests:
            found.tests.append(job.test_id)
            found.outcomes[job.outcome] += 1
    for nodeid in record.start.get("planned", []):
        if nodeid not in ended and nodeid not in found.tests:
            found.tests.append(str(nodeid))
            found.outcomes["not run"] += 1
    return found


def _history_url(given: str | None) -> str | None:
    """The PostgreSQL history named on the command line, else in [tool.devpool]; None."""
    from devpool.history.location import HistoryUrl, named_history

    if given:
        spec = named_history(given, "--devpool-history")
        if not isinstance(spec, HistoryUrl):
            raise DevpoolError(
                f"--devpool-history must be a PostgreSQL URL to find a queue run, got {given!r}"
            )
        return spec.url
    from devpool.project import project_settings

    history = project_settings(Path.cwd()).history
    return history.url if isinstance(history, HistoryUrl) else None


def _of_queue(url: str, run_id: str) -> NotPassed:
    from devpool.database import where
    from devpool.queue.store import QueueStore

    store = QueueStore(url, run_id, option="--devpool-history", read_only=True)
    try:
        if not store.published():
            raise DevpoolError(
                f"no run folder or record at {run_id!r}, and no queue run {run_id!r} at "
                f"{where(url)} (RUN is {RUN_FORMS})"
            )
        rows = store.tests()
    finally:
        store.close()
    found = NotPassed(f"queue run {run_id!r}")
    for row in rows:
        outcome = row.outcome if row.state == "done" else "not run"
        if outcome in _NOT_PASSED or outcome == "not run":
            found.tests.append(row.test_id)
            found.outcomes[str(outcome)] += 1
    return found


# ---- in the pytest session the rerun starts ------------------------------------------------


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the tests the rerun names (the controller's choice: workers run what it sends)."""
    listed = os.environ.get(RERUN_ENV)
    if not listed or getattr(config.option, "devpool_worker", None):
        return
    wanted = set(Path(listed).read_text(encoding="utf-8").split("\n")) - {""}
    kept = [item for item in items if item.nodeid in wanted]
    dropped = [item for item in items if item.nodeid not in wanted]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
