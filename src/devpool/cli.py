"""The `devpool` command: everything around a run (locks now; reports, capacity, shards later)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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


def _doctor(args: argparse.Namespace) -> int:
    """Everything devpool can see on this host, one fact a line; never hangs (timeouts)."""
    import os
    import platform as host_platform

    import pytest

    from devpool import probes
    from devpool.config import read_table, settings_from
    from devpool.fairshare import WaitingRoom
    from devpool.inventory import BUILTIN_PLATFORMS, detect, resolve_inventory

    python = host_platform.python_version()
    print(f"devpool {__version__}, pytest {pytest.__version__}, Python {python}")
    table = read_table(Path.cwd() / "pyproject.toml")
    settings = settings_from({"devpool_devices": args.devices}, table, "pyproject.toml")
    for kind in ("cuda", "ascend", "rocm"):
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
        inventory = resolve_inventory(settings.devices, settings.platforms, os.environ)
        print(f"inventory: {inventory.describe()} from {inventory.source}")
        probe = probes.probe_for(inventory.platform.kind, os.environ)
        seen = probe(inventory.devices)
        if seen is None:
            print("probe: unknown (the tool is missing or timed out)")
        else:
            for device, procs in sorted(seen.items()):
                who = ", ".join(p.describe() for p in procs) or "no other process"
                print(f"probe {inventory.platform.name}:{device}: {who}")
    lock_dir = LockDir(Path(args.lock_dir) if args.lock_dir else settings.lock_dir)
    states = lock_dir.status()
    held = [s for s in states if s.held]
    print(f"lock folder {lock_dir.path}: writable, {len(states)} lock files, {len(held)} held")
    for state in held:
        who = state.holder.describe() if state.holder else "an unknown holder"
        print(f"  {state.platform}:{state.device} held by {who}")
    room = WaitingRoom(lock_dir.path, session="doctor")
    for platform_name in sorted({s.platform for s in states}):
        for waiter in room.others(platform_name):
            print(f"  run {waiter.session} (pid {waiter.pid}) waits for {waiter.wants} device(s)")
    return 0


def _history_path(args: argparse.Namespace) -> tuple[Path, bool]:
    """The history file and whether the user named it (a named one must exist to be read)."""
    from devpool.history import default_history_path

    if args.history:
        return Path(args.history), True
    return default_history_path(Path.cwd()), False


def _estimates(args: argparse.Namespace) -> tuple[dict[str, float], dict[str, float]]:
    """(latest p90, p90 before the latest run) per test; empty without a history file."""
    from devpool.history import History

    path, named = _history_path(args)
    if not path.exists():
        if named:
            raise DevpoolError(f"--history {path} does not exist")
        return {}, {}
    with History(path) as history:
        return history.estimates(), history.previous_estimates()


def _default_platform(table: dict[str, object]) -> str:
    """The platform of [tool.devpool] devices ('cuda:0-7' -> 'cuda'), else cuda."""
    devices = table.get("devices")
    if isinstance(devices, str):
        name = devices.partition(":")[0].strip()
        if name and name != "auto" and not name[0].isdigit():
            return name
    return "cuda"


def _positive(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise DevpoolError(f"{what} must be a number above 0, got {text!r}")
    return value


def _chosen_platform(args: argparse.Namespace, seen: Any) -> str:
    """--platform, else the one [tool.devpool] devices names; it must be a known platform."""
    name: str = args.platform or _default_platform(seen.table)
    if name not in seen.platforms:
        raise DevpoolError(
            f"--platform {name!r} is not a known platform; known: "
            f"{', '.join(sorted(seen.platforms))} (add others under [tool.devpool.platforms])"
        )
    return name


def _capacity(args: argparse.Namespace) -> int:
    from devpool import capacity

    classes = dict(capacity.parse_runner_class(text) for text in args.runner_class or ())
    devices = int(_positive(str(args.devices_per_runner), "--devices-per-runner"))
    default = _positive(str(args.default_estimate), "--default-estimate")
    factor = _positive(str(args.drift_factor), "--drift-factor")
    estimates, previous = _estimates(args)
    seen = capacity.collect_suite(args.paths)
    platform = _chosen_platform(args, seen)
    kind = seen.platforms[platform].kind
    capacity.apply_quarantine(seen.tests, seen.quarantine, platform, kind)
    rep = capacity.report(
        seen.tests,
        platform,
        classes or None,
        estimates,
        default,
        devices_per_runner=devices,
        previous=previous,
        drift_factor=factor,
        timeline=args.timeline,
        kind=kind,
    )
    renderers = {
        "text": capacity.render_text,
        "markdown": capacity.render_markdown,
        "json": capacity.render_json,
    }
    sys.stdout.write(renderers[args.format](rep))
    return 0


def _shard(args: argparse.Namespace) -> int:
    import json
    import shlex

    from devpool import capacity, shards

    devices = int(_positive(str(args.devices_per_runner), "--devices-per-runner"))
    default = _positive(str(args.default_estimate), "--default-estimate")
    budget = shards.parse_budget(args.budget) if args.budget is not None else None
    if args.runners is not None and args.runners < 1:
        raise DevpoolError(f"--runners must be 1 or more, got {args.runners}")
    estimates, _ = _estimates(args)
    seen = capacity.collect_suite(args.paths)
    name = _chosen_platform(args, seen)
    # As a run does: tests whose platforms marker leaves this platform out are not sharded.
    admitted = {name, seen.platforms[name].kind}
    tests = [t for t in seen.tests if t.platforms is None or admitted & set(t.platforms)]
    items = [
        shards.shard_item(t.nodeid, t.request, estimates.get(t.nodeid, default), args.by_module)
        for t in tests
    ]
    count = args.runners if budget is None else shards.shards_for_budget(items, budget, devices)
    split = shards.assign(items, count)
    walls = [shards.wall_estimate(shard, devices) for shard in split]
    commands = [
        shlex.join(
            ["python", "-m", "pytest", f"--devpool-shard={k}/{count}"]
            + (["--devpool-shard-by-module"] if args.by_module else [])
            + list(args.paths)
        )
        for k in range(1, count + 1)
    ]
    if budget is not None and max(walls, default=0.0) > 0.8 * budget:
        slowest = max(walls)
        print(
            f"devpool: warning: the slowest shard is estimated at {slowest:,.0f} s, "
            f"{slowest / budget:.0%} of the {budget:,.0f} s budget; "
            "add a runner before the suite outgrows it",
            file=sys.stderr,
        )
    known = sum(1 for t in tests if t.nodeid in estimates)
    if args.format == "json":
        data = {
            "schema": "devpool-shards/1",
            "shards": count,
            "devices_per_runner": devices,
            "budget_seconds": budget,
            "by_module": args.by_module,
            "estimates_from_history": known,
            "estimates_at_default": len(tests) - known,
            "default_estimate": default,
            "split": [
                {
                    "shard": f"{k}/{count}",
                    "tests": [item.nodeid for item in shard],
                    "device_seconds": round(sum(item.cost for item in shard), 3),
                    "wall_seconds": round(wall, 3),
                    "command": command,
                }
                for k, (shard, wall, command) in enumerate(
                    zip(split, walls, commands, strict=True), 1
                )
            ],
        }
        print(json.dumps(data, indent=2, ensure_ascii=False))
        return 0
    over = f"; budget {budget:,.0f} s" if budget is not None else ""
    print(
        f"devpool shard: {len(tests)} tests in {count} shards on runners of {devices} devices"
        f"{over}; estimates: {known} from history, {len(tests) - known} at {default:g} s"
    )
    print(f"  {'shard':>7}  {'tests':>6}  {'device-s':>10}  {'wall':>10}")
    for k, (shard, wall) in enumerate(zip(split, walls, strict=True), 1):
        cost = sum(item.cost for item in shard)
        print(f"  {f'{k}/{count}':>7}  {len(shard):>6}  {cost:>10,.1f}  {wall:>10,.1f}")
    print("commands:")
    for command in commands:
        print(f"  {command}")
    return 0


def _history_export(args: argparse.Namespace) -> int:
    from devpool.history import History

    path, _ = _history_path(args)
    if not path.exists():
        raise DevpoolError(f"there is no history at {path} to export")
    with History(path) as history:
        rows = history.export(Path(args.out))
    print(f"devpool: exported {rows} results from {path} to {args.out}")
    return 0


def _history_merge(args: argparse.Namespace) -> int:
    from devpool.history import History

    path, _ = _history_path(args)
    with History(path) as history:
        added = history.merge(Path(args.source))
    print(f"devpool: merged {added} new results from {args.source} into {path}")
    return 0


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
    doctor = commands.add_parser(
        "doctor", help="platform, devices, drivers, lock folder, holders and probe results"
    )
    doctor.add_argument("--devices", help="also resolve and probe this --devices SPEC")
    doctor.add_argument("--lock-dir", help="lock folder (default: devpool's)")
    doctor.add_argument("--timeout", type=float, default=5.0, help="seconds per tool call")
    doctor.set_defaults(func=_doctor)
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
    _add_capacity_commands(commands)
    return parser


def _add_capacity_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    history_help = "duration history (default .devpool/history.sqlite here)"
    capacity = commands.add_parser(
        "capacity",
        help="count the suite's tests per device count and estimate their cost; runs nothing",
    )
    capacity.add_argument(
        "paths",
        nargs="*",
        help="what pytest collects (default: testpaths); after --, pytest options too",
    )
    capacity.add_argument("--platform", help="platform to report for (default: [tool.devpool])")
    capacity.add_argument("--devices-per-runner", default="8", metavar="N")
    capacity.add_argument(
        "--runner-class",
        action="append",
        metavar="NAME=N",
        help="a CI runner class and its devices, e.g. cuda-8=8 (repeatable)",
    )
    capacity.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    capacity.add_argument(
        "--timeline",
        "--devpool-timeline",
        dest="timeline",
        action="store_true",
        help="estimated makespan on 1, 2, 4, … devices",
    )
    capacity.add_argument("--history", help=history_help)
    capacity.add_argument("--drift-factor", default="2.0", metavar="F")
    capacity.add_argument("--default-estimate", default="1.0", metavar="SECONDS")
    capacity.set_defaults(func=_capacity)

    shard = commands.add_parser(
        "shard", help="split the suite across CI runners by estimated device-seconds"
    )
    shard.add_argument(
        "paths",
        nargs="*",
        help="what pytest collects (default: testpaths); after --, pytest options too",
    )
    size = shard.add_mutually_exclusive_group(required=True)
    size.add_argument("--runners", type=int, metavar="N", help="split into N shards")
    size.add_argument("--budget", metavar="TIME", help="fewest shards that fit, e.g. 45m")
    shard.add_argument("--platform", help="platform the runners have (default: [tool.devpool])")
    shard.add_argument("--devices-per-runner", default="8", metavar="N")
    shard.add_argument(
        "--by-module", action="store_true", help="keep each module's tests in one shard"
    )
    shard.add_argument("--history", help=history_help)
    shard.add_argument("--default-estimate", default="1.0", metavar="SECONDS")
    shard.add_argument("--format", choices=("text", "json"), default="text")
    shard.set_defaults(func=_shard)

    history = commands.add_parser("history", help="move the duration history between runners")
    actions = history.add_subparsers(dest="action", required=True, metavar="ACTION")
    export = actions.add_parser("export", help="write the history as a plain JSON-lines file")
    export.add_argument("out")
    export.add_argument("--history", help=history_help)
    export.set_defaults(func=_history_export)
    merge = actions.add_parser("merge", help="add an export (or a history file) to the history")
    merge.add_argument("source")
    merge.add_argument("--history", help=history_help)
    merge.set_defaults(func=_history_merge)


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
