"""`devpool queue report`: the one verdict of a run that many jobs shared through the queue."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from devpool.database import where
from devpool.errors import DevpoolError
from devpool.queue.selection import selection_line
from devpool.queue.source import run_id_from
from devpool.queue.status import SCHEMA, run_status
from devpool.queue.store import QueueStore
from devpool.queue.verdict import NO_TESTS, jobs_line, outcome_of, wait_for_end, write_junit
from devpool.report.github import write_step_summary
from devpool.report.jsonout import render_json
from devpool.report.markdown import render_markdown
from devpool.report.text import render_text

DEFAULT_WAIT = 3600.0  # seconds the report waits for jobs still running (a CI step's bound)


def add_queue_command(commands: argparse._SubParsersAction[Any]) -> None:
    """`devpool queue report`, under the `devpool` parser."""
    queue = commands.add_parser(
        "queue", help="a run shared by many CI jobs through --devpool-queue: its verdict"
    )
    actions = queue.add_subparsers(dest="queue_command", required=True, metavar="ACTION")
    what = (
        "wait for the run's tests to end (or for no live job to be able to take what remains), "
        "then print its one summary, write one JUnit file and the GitHub step summary; "
        "exits as pytest would, or 6 when tests of a platform class no job of it took did not "
        "run"
    )
    report = actions.add_parser("report", help=what, description=what[0].upper() + what[1:] + ".")
    _queue_options(report)
    report.add_argument("--junitxml", metavar="FILE", help="write one JUnit file, each test once")
    report.add_argument(
        "--format", choices=("text", "markdown", "json"), default="text", help="(default text)"
    )
    report.add_argument(
        "--wait",
        type=_seconds,
        default=DEFAULT_WAIT,
        metavar="S",
        help="seconds to wait for jobs still running before reporting what ended "
        f"(default {DEFAULT_WAIT:g})",
    )
    report.set_defaults(func=queue_report)
    what = "the run's jobs (host, devices, alive, claimed, done) and what is still queued"
    status = actions.add_parser("status", help=what, description=what[0].upper() + what[1:] + ".")
    _queue_options(status)
    status.add_argument("--format", choices=("text", "json"), default="text", help="(default text)")
    status.set_defaults(func=queue_status)


def _queue_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--devpool-queue",
        dest="queue",
        metavar="URL",
        help="the queue's PostgreSQL URL (default: [tool.devpool] queue)",
    )
    parser.add_argument(
        "--devpool-queue-run",
        dest="queue_run",
        metavar="ID",
        help="the run (default: [tool.devpool] queue-run, else $GITHUB_RUN_ID-$GITHUB_RUN_ATTEMPT)",
    )


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds ≥ 0, got {text!r}")
    return value


def _open_run(args: argparse.Namespace) -> QueueStore:
    """The store of the run the arguments name; one sentence when nobody started it."""
    url, run_id = _where(args)
    store = QueueStore(url, run_id)
    if not store.published():
        store.close()
        raise DevpoolError(
            f"queue run {run_id!r} at {where(url)} was never started: no job of it reached "
            "the queue (check --devpool-queue-run)"
        )
    return store


def queue_status(args: argparse.Namespace) -> int:
    """Print the run's jobs and what is still queued."""
    store = _open_run(args)
    try:
        store.reap()
        status = run_status(store.run_id, store.jobs(), store.tests(), store.lapsed())
    finally:
        store.close()
    if args.format == "json":
        print(json.dumps({"schema": SCHEMA, **status.to_json()}, indent=2))
    else:
        print("\n".join(status.lines()))
    return 0


def queue_report(args: argparse.Namespace) -> int:
    """Print the run's verdict; its exit status is pytest's for the whole run."""
    store = _open_run(args)
    run_id = store.run_id
    try:
        rows = wait_for_end(store, args.wait)
        verdict = outcome_of(run_id, rows, store.jobs(), store.classes() or ())
        selected, kept_none = selection_line(store.db, run_id) or ("", False)
    finally:
        store.close()
    record = verdict.record
    if args.format == "json":
        sys.stdout.write(render_json(record))
    elif args.format == "markdown":
        sys.stdout.write(render_markdown(record) + (f"\n{selected}\n" if selected else ""))
    else:
        sys.stdout.write(render_text(record) + jobs_line(verdict.jobs) + "\n")
        sys.stdout.write(f"{selected}\n" if selected else "")
    if kept_none and verdict.exitstatus == NO_TESTS:
        return 0  # nothing a change can affect is not "no tests collected": CI stays green
    if args.junitxml:
        write_junit(Path(args.junitxml), verdict)
    write_step_summary(record)
    return verdict.exitstatus


def _where(args: argparse.Namespace) -> tuple[str, str]:
    """The queue and run of the command line, else of [tool.devpool] here, else GitHub's."""
    url, run = args.queue, args.queue_run
    if url is None or run is None:
        from devpool.project import project_settings

        settings = project_settings(Path.cwd())
        url = url or settings.queue
        run = run or settings.queue_run
    if not url:
        raise DevpoolError("devpool queue needs --devpool-queue=URL (or queue in [tool.devpool])")
    return url, run_id_from(run, os.environ)
