"""The `devpool` command: everything around a run (locks, reports, capacity, shards, history).

Usage mistakes exit 4 with one sentence, as pytest's do; no option takes an abbreviation
(`--devices` must never be read as `--devices-per-runner`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from devpool import __version__
from devpool.errors import DevpoolError
from devpool.leases import LockDir
from devpool.record import latest_record, read_record
from devpool.report.github import write_step_summary
from devpool.report.jsonout import render_json
from devpool.report.markdown import render_markdown
from devpool.report.text import render_text


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


def _locks(args: argparse.Namespace) -> int:
    lock_dir = LockDir(Path(args.lock_dir) if args.lock_dir else _project().lock_dir)
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
    from devpool.fairshare import WaitingRoom
    from devpool.inventory import BUILTIN_PLATFORMS, detect, resolve_inventory

    python = host_platform.python_version()
    print(f"devpool {__version__}, pytest {pytest.__version__}, Python {python}")
    settings = _project(args.devices)
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


def _spec_platform(spec: str | None, platforms: Any) -> tuple[str, int | None]:
    """(platform, devices it names) of a --devices SPEC; cuda without one; auto detects."""
    from devpool.inventory import detect, parse_ids

    if spec is None:
        return "cuda", None
    name, colon, ids = spec.strip().partition(":")
    if colon:
        return name, len(parse_ids(ids))
    if name and name != "auto" and not name[0].isdigit():
        return name, None
    for kind in ("cuda", "ascend", "rocm"):  # as --devices auto looks for them
        found = detect(kind, timeout=10.0)
        if found:
            chosen = [n for n, p in sorted(platforms.items()) if p.kind == kind]
            return (kind if kind in platforms else chosen[0]), len(found)
    raise DevpoolError(
        f"--devices {spec} found no accelerator on this host, so the platform to report "
        "for is unknown; name it with --platform"
    )


def _positive(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise DevpoolError(f"{what} must be a number above 0, got {text!r}")
    return value


def _chosen_platform(args: argparse.Namespace, seen: Any) -> tuple[str, int]:
    """(platform, devices per runner) for capacity and shard.

    The platform: --platform, else that of --devices after `--`, else of [tool.devpool]
    devices (with its profile), else cuda. Devices per runner: --devices-per-runner, else
    as many as that --devices names, else 8.
    """
    named, count = _spec_platform(None if args.platform else seen.devices, seen.platforms)
    name: str = args.platform or named
    if name not in seen.platforms:
        raise DevpoolError(
            f"--platform {name!r} is not a known platform; known: "
            f"{', '.join(sorted(seen.platforms))} (add others under [tool.devpool.platforms])"
        )
    text = args.devices_per_runner or str(count or 8)
    return name, int(_positive(text, "--devices-per-runner"))


def _capacity(args: argparse.Namespace) -> int:
    from devpool import capacity

    classes = dict(capacity.parse_runner_class(text) for text in args.runner_class or ())
    default = _positive(str(args.default_estimate), "--default-estimate")
    factor = _positive(str(args.drift_factor), "--drift-factor")
    estimates, previous = _estimates(args)
    seen = capacity.collect_suite(args.paths)
    platform, devices = _chosen_platform(args, seen)
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

    default = _positive(str(args.default_estimate), "--default-estimate")
    budget = shards.parse_budget(args.budget) if args.budget is not None else None
    if args.runners is not None and args.runners < 1:
        raise DevpoolError(f"--runners must be 1 or more, got {args.runners}")
    estimates, _ = _estimates(args)
    seen = capacity.collect_suite(args.paths)
    name, devices = _chosen_platform(args, seen)
    # As a run does: tests whose platforms marker leaves this platform out are not sharded.
    admitted = {name, seen.platforms[name].kind}
    tests = [t for t in seen.tests if t.platforms is None or admitted & set(t.platforms)]
    items = [
        shards.shard_item(t.nodeid, t.request, estimates.get(t.nodeid, default), args.by_module)
        for t in tests
    ]
    by_id = {item.nodeid: item for item in items}
    count = args.runners if budget is None else shards.shards_for_budget(items, budget, devices)
    whole = shards.split_suite([t.nodeid for t in tests], items, count)
    split = [[by_id[nodeid] for nodeid in shard] for shard in whole.shards]
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
            "fingerprint": whole.fingerprint,
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
    print(f"split fingerprint {whole.fingerprint}: each shard's record carries its own")
    print("commands:")
    for command in commands:
        print(f"  {command}")
    return 0


def _shard_verify(args: argparse.Namespace) -> int:
    from devpool.shardcheck import read_shard_runs, verify

    verdict = verify(read_shard_runs([Path(p) for p in args.records]))
    (sys.stdout if verdict.ok else sys.stderr).write(verdict.render())
    return 0 if verdict.ok else 1


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
    from devpool.history import History, pending_dir

    path, _ = _history_path(args)
    with History(path) as history:
        if not args.sources:
            added, files = history.merge_pending()
            where = f"{len(files)} pending run files in {pending_dir(path)}"
            print(f"devpool: merged {added} new results from {where} into {path}")
            return 0
        for source in args.sources:
            added = history.merge(Path(source))
            print(f"devpool: merged {added} new results from {source} into {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="devpool",
        description="Around a devpool run: who holds which device on this host, and more.",
    )
    parser.add_argument("--version", action="version", version=f"devpool {__version__}")
    # Subparsers are made with the parent's class: no abbreviations, exit 4 on every level.
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
    run.add_argument(
        "pytest_args",
        nargs=argparse.REMAINDER,
        help="-- then pytest's arguments (a leading `pytest` or `python -m pytest` is dropped)",
    )
    run.set_defaults(func=_run)
    _add_capacity_commands(commands)
    return parser


def _add_capacity_commands(commands: argparse._SubParsersAction[_Parser]) -> None:
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
    capacity.add_argument(
        "--devices-per-runner", metavar="N", help="default: what --devices names, else 8"
    )
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
        "shard",
        help="split the suite across CI runners by estimated device-seconds; "
        "`devpool shard verify RECORDS...` checks that the shards ran every test once",
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
    shard.add_argument(
        "--devices-per-runner", metavar="N", help="default: what --devices names, else 8"
    )
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
    merge = actions.add_parser(
        "merge",
        help="add exports (or history files) to the history; with none, the pending "
        "results of shard runs (.devpool/history.d)",
    )
    merge.add_argument("sources", nargs="*", metavar="SOURCE")
    merge.add_argument("--history", help=history_help)
    merge.set_defaults(func=_history_merge)


def build_verify_parser() -> argparse.ArgumentParser:
    """`devpool shard verify RECORDS...` (its own parser: `devpool shard` takes test paths)."""
    verify = _Parser(
        prog="devpool shard verify",
        description="Check the run records of every shard of one CI run: each test ran in "
        "exactly one shard, all shards split alike, no shard is missing or given twice. "
        "Exit 0 and one OK line, or exit 1 naming the tests.",
    )
    verify.add_argument("records", nargs="+", metavar="RECORD", help="record.jsonl of a shard")
    verify.set_defaults(func=_shard_verify)
    return verify


_PASS_THROUGH = ("run", "capacity", "shard")  # commands whose arguments after `--` go to pytest


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The command line as a namespace; everything after `--` reaches pytest untouched."""
    argv = list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    if command == "shard" and argv[argv.index("shard") + 1 : argv.index("shard") + 2] == ["verify"]:
        at = argv.index("shard")
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
    if args.command == "run":
        args.pytest_args = [*args.pytest_args, *after]
    elif args.command in ("capacity", "shard"):
        args.paths = [*args.paths, *after]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `devpool` command; a user mistake is one line and exit code 4."""
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        code: int = args.func(args)
    except DevpoolError as exc:
        print(f"devpool: error: {exc}", file=sys.stderr)
        return 4
    return code


if __name__ == "__main__":
    sys.exit(main())
