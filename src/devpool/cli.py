"""The `devpool` command: everything around a run (locks, reports, capacity, shards, history).

Usage mistakes exit 4 with one sentence, as pytest's do; no option takes an abbreviation
(`--devices` must never be read as `--devices-per-runner`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from devpool.capacity.adopt import add_adopt_command
from devpool.capacity.cli import add_capacity_commands, shard_verify
from devpool.devices.lockdir import LockDir, default_lock_dir
from devpool.devices.resources import HostLockState, host_status
from devpool.errors import DevpoolError
from devpool.queue.cli import add_queue_command
from devpool.report.github import write_step_summary
from devpool.report.jsonout import render_json
from devpool.report.markdown import render_markdown
from devpool.report.record import latest_record, read_run
from devpool.report.text import render_text
from devpool.select.cli import add_select_command, build_transfer_parser
from devpool.serve import add_serve_command
from devpool.session.rerun import add_rerun_command
from devpool.version import __version__


class _Parser(argparse.ArgumentParser):
    """argparse with no abbreviations, whose usage errors are one sentence and exit 4."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(4)


def _project(devices: str | None = None) -> Any:
    """The settings a run here would use: [tool.devpool] and its profile, from pyproject.toml."""
    from devpool.project import project_settings

    return project_settings(Path.cwd(), (), {"devpool_devices": devices})


def _named_lock_dir(args: argparse.Namespace) -> Path | None:
    """The --lock-dir a user named, which must be a folder (a run's default may not exist yet)."""
    if not args.lock_dir:
        return None
    path = Path(args.lock_dir)
    if not path.is_dir():
        what = "is not a folder" if path.exists() else "does not exist"
        raise DevpoolError(f"--lock-dir {path} {what}")
    return path


def _locks(args: argparse.Namespace) -> int:
    if args.ray_address is not None:
        from devpool.serve.cluster import locks_lines

        if args.lock_dir:
            raise DevpoolError("give --lock-dir or --ray-address, not both")
        print("\n".join(locks_lines(args.ray_address or None)))
        return 0
    lock_dir = LockDir(_named_lock_dir(args) or _project().lock_dir)
    states = lock_dir.status()
    held = host_status(lock_dir.path)
    if not states and not held:
        print(f"no device lock files in {lock_dir.path}")
        return 0
    if not states:
        _host_locks(held)
        return 0
    print(f"device locks in {lock_dir.path}:")
    for state in states:
        device = f"{state.platform}:{state.device}"
        if state.held:
            who = state.holder.describe() if state.holder else "an unknown holder"
            print(f"  {device:12} held by {who}")
        elif state.shares:
            print(f"  {device:12} shared by {len(state.shares)}:")
            for share in state.shares:
                print(f"  {'':12}   {share.describe()}")
        else:
            print(f"  {device:12} free")
    _host_locks(held)
    return 0


def _host_locks(held: list[HostLockState]) -> None:
    """Held ports and resource units (devices/resources.py), one line each."""
    if not held:
        return
    print("ports and resources held:")
    for state in held:
        name = f"port {state.name}" if state.kind == "port" else f"{state.name}[{state.unit}]"
        who = state.holder.describe() if state.holder else "an unknown holder"
        print(f"  {name:12} held by {who}")


def _report(args: argparse.Namespace) -> int:
    if args.diff:
        from devpool.report.diff import SLOWER_FACTOR, render_diff

        if args.record or args.html or args.step_summary:
            raise DevpoolError(
                "--diff OLD NEW compares two runs: give no record, --html or --step-summary with it"
            )
        slower = SLOWER_FACTOR if args.slower is None else args.slower
        if not slower > 1:
            raise DevpoolError(f"--slower must be a factor above 1, got {slower:g}")
        sys.stdout.write(render_diff([Path(p) for p in args.diff], args.format or "text", slower))
        return 0
    if args.slower is not None:
        raise DevpoolError("--slower compares two runs: it goes with --diff OLD NEW")
    path = Path(args.record) if args.record else latest_record(Path.cwd())
    if path is None:
        raise DevpoolError("no run record given and none under .devpool/runs/ here")
    record = read_run(path)
    if record.damage:
        print(f"devpool: {record.damage}", file=sys.stderr)
    if args.html:
        from devpool.report.html import render_html

        page = Path(args.html)
        try:  # a folder that does not exist yet is made, as the run makes its run folder
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text(render_html(record), encoding="utf-8")
        except OSError as exc:
            raise DevpoolError(f"cannot write {page}: {exc.strerror or exc}") from None
        print(f"devpool: wrote {args.html}", file=sys.stderr)
    if args.step_summary and not write_step_summary(record):
        raise DevpoolError("--step-summary needs GITHUB_STEP_SUMMARY to name a file")
    renderers = {"text": render_text, "markdown": render_markdown, "json": render_json}
    if not args.html or args.format:
        sys.stdout.write(renderers[args.format or "text"](record))
    return 0


def _run(args: argparse.Namespace) -> int:
    from devpool.session.runner import run_pytest

    return run_pytest(
        args.pytest_args,
        Path(args.run_record) if args.run_record else None,
        Path(args.log) if args.log else None,
    )


def _doctor(args: argparse.Namespace) -> int:
    """Everything devpool can see on this host, one fact a line; never hangs (timeouts)."""
    import platform as host_platform

    import pytest

    from devpool.devices import probes
    from devpool.devices.inventory import AUTO_ORDER, BUILTIN_PLATFORMS, detect, resolve_inventory
    from devpool.devices.waiting_room import WaitingRoom

    named = _named_lock_dir(args)  # a mistake is said before any fact
    python = host_platform.python_version()
    print(f"devpool {__version__}, pytest {pytest.__version__}, Python {python}")
    settings = _project(args.devices)
    for kind in AUTO_ORDER:
        found = detect(kind, timeout=args.timeout)
        print(f"{kind:7} devices: {', '.join(map(str, found)) if found else 'none found'}")
    for argv in (
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
        ["npu-smi", "-v"],
        ["rocm-smi", "--showdriverversion"],
    ):
        out = probes.run_tool(argv, args.timeout)
        first = out.strip().splitlines()[0] if out and out.strip() else "not available"
        print(f"driver ({argv[0]}): {first}")
    for platform in BUILTIN_PLATFORMS.values():
        env = platform.visible_env
        if env and env in os.environ:
            print(f"{env}={os.environ[env]!r} is set: it narrows --devices auto")
    if settings.devices:
        try:
            inventory = resolve_inventory(settings.devices, settings.platforms, os.environ)
        except DevpoolError as exc:  # the diagnosis itself: say it, as a run would refuse
            print(f"inventory: {exc}")
            return 4
        print(f"inventory: {inventory.describe()} from {inventory.source}")
        probe = probes.probe_for(inventory.platform.kind, os.environ)
        seen = probe(inventory.devices)
        if seen is None:
            print("probe: unknown (the tool is missing or timed out)")
        else:
            for device, procs in sorted(seen.items()):
                who = ", ".join(p.describe() for p in procs) or "no other process"
                print(f"probe {inventory.platform.name}:{device}: {who}")
    lock_dir = LockDir(named or settings.lock_dir)
    states = lock_dir.status()
    held = [s for s in states if s.held]
    shared = [s for s in states if s.shares]
    print(
        f"lock folder {lock_dir.path}: writable, {len(states)} lock files, {len(held)} held"
        + (f", {len(shared)} shared" if shared else "")
    )
    for state in held:
        who = state.holder.describe() if state.holder else "an unknown holder"
        print(f"  {state.platform}:{state.device} held by {who}")
    for state in shared:
        for share in state.shares:
            print(f"  {state.platform}:{state.device} shared: {share.describe()}")
    room = WaitingRoom(lock_dir.path, session="doctor", say=lambda line: print(f"  {line}"))
    for platform_name in sorted({s.platform for s in states}):
        for waiter in room.others(platform_name):
            print(f"  run {waiter.session} (pid {waiter.pid}) waits for {waiter.wants} device(s)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="devpool",
        description="Around a devpool run: who holds which device on this host, and more.",
    )
    parser.add_argument("--version", action="version", version=f"devpool {__version__}")
    # Subparsers are made with the parent's class: no abbreviations, exit 4 on every level.
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    lock_dir_help = (
        "lock folder (default: lock-dir of [tool.devpool] here and its profile, as a run here "
        f"uses; else {default_lock_dir()})"
    )
    locks = commands.add_parser("locks", help="list who holds which device on this host")
    locks.add_argument("--lock-dir", help=lock_dir_help)
    locks.add_argument(
        "--ray-address",
        nargs="?",
        const="",
        help="list devpool's workers on a Ray cluster by run and node, and the runs waiting "
        "there for a fair share (default address: RAY_ADDRESS, else the cluster started on "
        "this host)",
    )
    locks.set_defaults(func=_locks)
    doctor = commands.add_parser(
        "doctor", help="platform, devices, drivers, lock folder, holders and probe results"
    )
    doctor.add_argument("--devices", help="also resolve and probe this --devices SPEC")
    doctor.add_argument("--lock-dir", help=lock_dir_help)
    doctor.add_argument("--timeout", type=float, default=5.0, help="seconds per tool call")
    doctor.set_defaults(func=_doctor)
    report = commands.add_parser(
        "report", help="render a run record again: text, markdown, json or an HTML timeline"
    )
    report.add_argument(
        "record", nargs="?", help="record.jsonl or run folder (default: the newest here)"
    )
    report.add_argument(
        "--format",
        choices=("text", "markdown", "json"),
        default=None,
        help="how to print the run (default text)",
    )
    report.add_argument("--html", metavar="OUT", help="write a self-contained HTML timeline")
    report.add_argument(
        "--diff",
        nargs=2,
        metavar=("OLD", "NEW"),
        help="what changed between two runs (record.jsonl or run folder): newly failing, "
        "fixed, newly flaky, gone, new, slower",
    )
    report.add_argument(
        "--slower",
        type=float,
        default=None,
        metavar="FACTOR",
        help="with --diff: a test this many times slower than in OLD is a regression (2; "
        "tests under 0.1 s in NEW never are)",
    )
    report.add_argument(
        "--step-summary", action="store_true", help="append Markdown to GITHUB_STEP_SUMMARY"
    )
    report.set_defaults(func=_report)
    run = commands.add_parser(
        "run",
        help="run pytest, then write the record, step summary and exit code even if it died",
    )
    run.add_argument("--run-record", help="where the record goes (default .devpool/runs/…)")
    run.add_argument(
        "--log",
        metavar="FILE",
        help="also write everything printed to FILE as it is printed (no `| tee`, whose "
        "exit status hides pytest's without pipefail)",
    )
    run.add_argument(
        "pytest_args",
        nargs=argparse.REMAINDER,
        help="-- then pytest's arguments (a leading `pytest` or `python -m pytest` is dropped)",
    )
    run.set_defaults(func=_run)
    add_rerun_command(commands)
    add_capacity_commands(commands)
    add_adopt_command(commands)
    add_select_command(commands)
    add_serve_command(commands)
    add_queue_command(commands)
    return parser


def build_verify_parser() -> argparse.ArgumentParser:
    """`devpool shard verify RECORDS...` (its own parser: `devpool shard` takes test paths)."""
    verify = _Parser(
        prog="devpool shard verify",
        description="Check the run records of every shard of one CI run: each test ran in "
        "exactly one shard, all shards split alike, no shard is missing or given twice. "
        "Exit 0 and one OK line, or exit 1 naming the tests.",
    )
    verify.add_argument("records", nargs="+", metavar="RECORD", help="record.jsonl of a shard")
    verify.set_defaults(func=shard_verify)
    return verify


# Commands whose arguments after `--` go to pytest.
_PASS_THROUGH = ("run", "rerun", "capacity", "shard", "adopt")


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The command line as a namespace; everything after `--` reaches pytest untouched."""
    argv = list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    if command == "select":
        at = argv.index("select")
        if argv[at + 1 : at + 2] in (["export"], ["import"], ["merge"]):
            transfer = build_transfer_parser(_Parser, argv[at + 1])
            parsed: argparse.Namespace = transfer.parse_args(argv[:at] + argv[at + 2 :])
            return parsed
    if command == "shard":
        at = argv.index("shard")
        if argv[at + 1 : at + 2] == ["verify"]:
            return build_verify_parser().parse_args(argv[:at] + argv[at + 2 :])
    after: list[str] = []
    if command in _PASS_THROUGH and "--" in argv:
        at = argv.index("--")
        argv, after = argv[:at], argv[at + 1 :]
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        hint = "; pytest's own options go after `--`" if command in _PASS_THROUGH else ""
        parser.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    if args.command in ("run", "rerun"):
        args.pytest_args = [*args.pytest_args, *after]
    elif args.command in ("capacity", "shard", "adopt"):
        args.paths = [*args.paths, *after]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `devpool` command; a user mistake is one line and exit code 4."""
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
        try:
            code: int = args.func(args)
        except DevpoolError as exc:
            print(f"devpool: error: {exc}", file=sys.stderr)
            return 4
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader left (`devpool select --explain | head`): end quietly, as git does.
        # Python's own flush at exit would fail again, so stdout goes nowhere from here.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, the status `git log | head` leaves
    return code


if __name__ == "__main__":
    sys.exit(main())
