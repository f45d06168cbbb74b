"""The `devpool` command: everything around a run (locks now; reports, capacity, shards later)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from devpool import __version__
from devpool.errors import DevpoolError
from devpool.leases import LockDir, default_lock_dir
from devpool.record import latest_record, read_record
from devpool.report.github import write_step_summary
from devpool.report.jsonout import render_json
from devpool.report.markdown import render_markdown
from devpool.report.text import render_text


def _locks(args: argparse.Namespace) -> int:
    lock_dir = LockDir(Path(args.lock_dir) if args.lock_dir else default_lock_dir())
    states = lock_dir.status()
    if not states:
        print(f"no device lock files in {lock_dir.path}")
        return 0
    print(f"device locks in {lock_dir.path}:")
    for state in states:
        device = f"{state.platform}:{state.device}"
        if state.held:
            who = state.holder.describe() if state.holder else "an unknown holder"
            print(f"  {device:12} held by {who}")
        else:
            print(f"  {device:12} free")
    return 0


def _report(args: argparse.Namespace) -> int:
    path = Path(args.record) if args.record else latest_record(Path.cwd())
    if path is None:
        raise DevpoolError("no run record given and none under .devpool/runs/ here")
    record = read_record(path)
    if record.damage:
        print(f"devpool: {record.damage}", file=sys.stderr)
    if args.html:
        from devpool.report.html import render_html

        Path(args.html).write_text(render_html(record), encoding="utf-8")
        print(f"devpool: wrote {args.html}", file=sys.stderr)
    if args.step_summary and not write_step_summary(record):
        raise DevpoolError("--step-summary needs GITHUB_STEP_SUMMARY to name a file")
    renderers = {"text": render_text, "markdown": render_markdown, "json": render_json}
    if not args.html or args.format:
        sys.stdout.write(renderers[args.format or "text"](record))
    return 0


def _run(args: argparse.Namespace) -> int:
    from devpool.runner import run_pytest

    return run_pytest(args.pytest_args, Path(args.run_record) if args.run_record else None)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="devpool",
        description="Around a devpool run: who holds which device on this host, and more.",
    )
    parser.add_argument("--version", action="version", version=f"devpool {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    locks = commands.add_parser("locks", help="list who holds which device on this host")
    locks.add_argument("--lock-dir", help="lock folder (default: the system temp folder's)")
    locks.set_defaults(func=_locks)
    report = commands.add_parser(
        "report", help="render a run record again: text, markdown, json or an HTML timeline"
    )
    report.add_argument("record", nargs="?", help="record.jsonl (default: the newest here)")
    report.add_argument("--format", choices=("text", "markdown", "json"), default=None)
    report.add_argument("--html", metavar="OUT", help="write a self-contained HTML timeline")
    report.add_argument(
        "--step-summary", action="store_true", help="append Markdown to GITHUB_STEP_SUMMARY"
    )
    report.set_defaults(func=_report)
    run = commands.add_parser(
        "run",
        help="run pytest, then write the record, step summary and exit code even if it died",
    )
    run.add_argument("--run-record", help="where the record goes (default .devpool/runs/…)")
    run.add_argument("pytest_args", nargs=argparse.REMAINDER, help="-- then pytest's arguments")
    run.set_defaults(func=_run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `devpool` command; a user mistake is one line and exit code 4."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except DevpoolError as exc:
        print(f"devpool: error: {exc}", file=sys.stderr)
        return 4
    return code


if __name__ == "__main__":
    sys.exit(main())
