"""The `devpool capacity`, `devpool shard` and `devpool history` commands.

They collect the suite (running nothing), read the duration history and print what the
suite costs or how it splits across CI runners; `devpool shard verify` is in shardcheck.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devpool.errors import DevpoolError

if TYPE_CHECKING:
    from devpool.history.location import HistorySpec


def _spec(text: str, option: str) -> HistorySpec:
    from devpool.history.location import named_history

    return named_history(text, option)


def _history_path(args: argparse.Namespace) -> tuple[HistorySpec, bool]:
    """The history (a file or a PostgreSQL URL) and whether the user named it (a named one
    must exist to be read)."""
    from devpool.history.durations import default_history_path

    if args.history:
        return _spec(args.history, "--history"), True
    return default_history_path(Path.cwd()), False


def _estimates(
    args: argparse.Namespace, platform: str
) -> tuple[dict[str, float], dict[str, float]]:
    """(latest p90, p90 before the latest run) per test, those measured on the platform
    first; empty without a history."""
    from devpool.history.location import history_found, open_history

    spec, named = _history_path(args)
    if not history_found(spec):
        if named:
            raise DevpoolError(f"--history {spec} does not exist")
        return {}, {}
    with open_history(spec) as history:
        return (
            history.estimates(platform=platform),
            history.previous_estimates(platform=platform),
        )


def _fixed(args: argparse.Namespace, platform: str, devices: int, tests: int) -> tuple[float, int]:
    """Start-up and fixed costs of recent runs like this one (see SqlHistory.fixed_cost)."""
    from devpool.history.location import history_found, open_history

    spec, _ = _history_path(args)
    if not history_found(spec):
        return 0.0, 0
    with open_history(spec) as history:
        return history.fixed_cost(platform, devices, tests)


def _peaks(args: argparse.Namespace) -> dict[str, tuple[int, int]]:
    """(watched results, highest peak) per test; empty without a history."""
    from devpool.history.location import history_found, open_history

    spec, named = _history_path(args)
    if not history_found(spec):
        if named:
            raise DevpoolError(f"--history {spec} does not exist")
        return {}
    with open_history(spec) as history:
        return history.peaks()


def _suggest_memory(args: argparse.Namespace) -> int:
    from devpool.capacity import memory_suggest
    from devpool.capacity import report as capacity

    peaks = _peaks(args)
    seen = capacity.collect_suite(args.paths)
    platform, _ = _chosen_platform(args, seen)
    found = memory_suggest.suggest(seen.tests, peaks, platform, seen.platforms[platform].kind)
    renderers = {
        "text": memory_suggest.render_text,
        "markdown": memory_suggest.render_markdown,
        "json": memory_suggest.render_json,
    }
    sys.stdout.write(renderers[args.format](found))
    return 0


def _spec_platform(spec: str | None, platforms: Any) -> tuple[str, int | None]:
    """(platform, devices it names) of a --devices SPEC; cuda without one; auto detects."""
    from devpool.devices.inventory import AUTO_ORDER, detect, named_ids

    if spec is None:
        return "cuda", None
    found_ids = named_ids(spec)
    if found_ids is not None:
        return found_ids[0], len(found_ids[1])
    name = spec.strip()
    if name and name != "auto" and not name[0].isdigit():
        return name, None
    for kind in AUTO_ORDER:  # as --devices auto looks for them
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
    from devpool.capacity import report as capacity

    if args.suggest_memory:
        return _suggest_memory(args)
    if args.classes is not None:
        return _capacity_classes(args)
    classes = dict(capacity.parse_runner_class(text) for text in args.runner_class or ())
    default = _positive(str(args.default_estimate), "--default-estimate")
    factor = _positive(str(args.drift_factor), "--drift-factor")
    _history_path(args)  # a bad --history is said before the suite is collected
    seen = capacity.collect_suite(args.paths)
    platform, devices = _chosen_platform(args, seen)
    estimates, previous = _estimates(args, platform)
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
        fixed=_fixed(args, platform, devices, len(seen.tests)),
        once=seen.once,
    )
    renderers = {
        "text": capacity.render_text,
        "markdown": capacity.render_markdown,
        "json": capacity.render_json,
    }
    sys.stdout.write(renderers[args.format](rep))
    return 0


def _capacity_classes(args: argparse.Namespace) -> int:
    """`devpool capacity --classes h100,h200`: device-hours per class of the fleet's mix."""
    from devpool.capacity import classes
    from devpool.capacity import report as capacity

    default = _positive(str(args.default_estimate), "--default-estimate")
    _history_path(args)
    seen = capacity.collect_suite(args.paths)
    mix = classes.parse_mix(args.classes, seen.platforms)
    rows, left = classes.class_rows(
        seen.tests, mix, seen.platforms, lambda name: _estimates(args, name)[0], default
    )
    sys.stdout.write(classes.render(rows, left, args.format))
    return 0


def _shard(args: argparse.Namespace) -> int:
    """`devpool shard`, for the platform of the runners, or for each class of --classes."""
    from devpool.capacity import classes
    from devpool.capacity import report as capacity

    _history_path(args)  # a bad --history is said before the suite is collected
    seen = capacity.collect_suite(args.paths)
    if args.classes is None:
        return _shard_one(args, seen, *_chosen_platform(args, seen))
    mix = classes.parse_mix(args.classes, seen.platforms)
    _, devices = _chosen_platform(args, seen)
    for name in mix:  # shards per class: each class's runners run the tests it admits
        if args.format == "text":
            print(f"== class {name} (--devices {name}:…)")
        _shard_one(args, seen, name, devices)
    if args.format == "text" and len(mix) > 1:
        print(
            "tests without a platforms filter are in every class's shards; a queue run "
            "(--devpool-queue) runs them once, on whichever class is free"
        )
    return 0


def _shard_one(args: argparse.Namespace, seen: Any, name: str, devices: int) -> int:
    import shlex

    from devpool.capacity import shard_render, shards

    default = _positive(str(args.default_estimate), "--default-estimate")
    budget = shards.parse_budget(args.budget) if args.budget is not None else None
    if args.runners is not None and args.runners < 1:
        raise DevpoolError(f"--runners must be 1 or more, got {args.runners}")
    estimates, _ = _estimates(args, name)
    # As a run does: tests whose platforms marker leaves this platform out are not sharded.
    kind = seen.platforms[name].kind
    tests = [t for t in seen.tests if t.platforms is None or {name, kind} & set(t.platforms)]
    capacity_bytes = shards.shard_capacity(seen.platforms[name], seen.memory_reserve)
    setups = shards.once_setups(seen.once, name, kind, estimates, default)
    items = [
        shards.shard_item(
            t.nodeid,
            t.request,
            estimates.get(t.nodeid, default),
            args.by_module,
            capacity=capacity_bytes,
            once=t.once,
        )
        for t in tests
    ]
    by_id = {item.nodeid: item for item in items}
    if budget is None:
        count = args.runners
    else:
        # Each runner pays the fixed costs of a run of its share of the suite: the estimate
        # is refined once from the shard count it gives.
        count = shards.shards_for_budget(items, budget, devices, setups)
        fixed, _ = _fixed(args, name, devices, max(1, len(tests) // count))
        if fixed >= budget:
            raise DevpoolError(
                f"the budget is {budget:,.0f} s, and a run on this runner costs {fixed:,.0f} s "
                "of start-up and fixed costs before its tests (from the history): no shard "
                "fits; give a larger --budget"
            )
        if fixed:
            count = shards.shards_for_budget(items, budget - fixed, devices, setups)
    fixed, _ = _fixed(args, name, devices, max(1, len(tests) // max(count, 1)))
    whole = shards.split_suite([t.nodeid for t in tests], items, count, setups)
    split = [[by_id[nodeid] for nodeid in shard] for shard in whole.shards]
    walls = [shards.wall_estimate(shard, devices, setups) + fixed for shard in split]
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
    suite = shard_render.ShardedSuite(
        name, whole, split, walls, commands, setups, devices, budget, args.by_module, known,
        default,
    )  # fmt: skip
    render = shard_render.render_json if args.format == "json" else shard_render.render_text
    sys.stdout.write(render(suite))
    return 0


def shard_verify(args: argparse.Namespace) -> int:
    from devpool.capacity.shardcheck import read_shard_runs, verify

    verdict = verify(read_shard_runs([Path(p) for p in args.records]))
    (sys.stdout if verdict.ok else sys.stderr).write(verdict.render())
    return 0 if verdict.ok else 1


def _history_export(args: argparse.Namespace) -> int:
    from devpool.history.location import history_found, open_history

    spec, _ = _history_path(args)
    if not history_found(spec):
        raise DevpoolError(f"there is no history at {spec} to export")
    with open_history(spec, read_only=True) as history:
        rows = history.export(Path(args.out))
    print(f"devpool: exported {rows} results from {spec} to {args.out}")
    return 0


def _history_merge(args: argparse.Namespace) -> int:
    from devpool.history.location import merge, open_history

    spec, _ = _history_path(args)
    sources = [_spec(source, "SOURCE") for source in args.sources]
    with open_history(spec) as history:
        if not sources:
            added, runs = history.merge_pending()
            where = f"{len(runs)} {history.pending_where()}"
            print(f"devpool: merged {added} new results from {where} into {spec}")
            return 0
        for source in sources:
            added = merge(history, source)
            print(f"devpool: merged {added} new results from {source} into {spec}")
    return 0


DEFAULT_ESTIMATE: dict[str, Any] = {
    "default": "1.0",
    "metavar": "SECONDS",
    "help": "seconds assumed for a test with no history (default 1.0)",
}


def add_capacity_commands(commands: argparse._SubParsersAction[Any]) -> None:
    """The capacity, shard and history commands, under the `devpool` parser."""
    history_help = (
        "duration history: a file (default .devpool/history.sqlite here) or a PostgreSQL URL "
        "(postgresql://USER@HOST:PORT/DB)"
    )
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
    capacity.add_argument(
        "--format",
        choices=("text", "markdown", "json"),
        default="text",
        help="how to print the report (default text)",
    )
    capacity.add_argument(
        "--timeline",
        "--devpool-timeline",
        dest="timeline",
        action="store_true",
        help="estimated makespan on 1, 2, 4, … devices",
    )
    capacity.add_argument(
        "--suggest-memory",
        action="store_true",
        help="propose @pytest.mark.device_memory per test from its recorded peaks "
        "(peak × 1.25, rounded up to 256 MiB below 4 GiB, to whole GiB above)",
    )
    capacity.add_argument("--history", help=history_help)
    capacity.add_argument(
        "--drift-factor",
        default="2.0",
        metavar="F",
        help="list tests whose p90 duration moved more than F times between the last two "
        "windows of history (default 2.0)",
    )
    capacity.add_argument("--default-estimate", **DEFAULT_ESTIMATE)
    capacity.add_argument(
        "--classes",
        metavar="NAMES",
        help="a fleet's class mix, platform names (e.g. h100,h200): device-hours per class",
    )
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
    shard.add_argument("--default-estimate", **DEFAULT_ESTIMATE)
    shard.add_argument(
        "--format", choices=("text", "json"), default="text", help="how to print the split"
    )
    shard.add_argument(
        "--classes",
        metavar="NAMES",
        help="a fleet's class mix, platform names (e.g. h100,h200): the shards of each class",
    )
    shard.set_defaults(func=_shard)
    also_usage(shard, "verify RECORD [RECORD ...]")

    history = commands.add_parser("history", help="move the duration history between runners")
    actions = history.add_subparsers(dest="action", required=True, metavar="ACTION")
    what = "write the history as a plain JSON-lines file"
    export = actions.add_parser("export", help=what, description=what.capitalize() + ".")
    export.add_argument("out", help="the JSON-lines file to write")
    export.add_argument("--history", help=history_help)
    export.set_defaults(func=_history_export)
    what = (
        "add exports (or history files) to the history; with none, the pending "
        "results of shard runs (.devpool/history.d)"
    )
    merge = actions.add_parser("merge", help=what, description=what.capitalize() + ".")
    merge.add_argument(
        "sources",
        nargs="*",
        metavar="SOURCE",
        help="an export, a history file or a PostgreSQL history's URL to add",
    )
    merge.add_argument("--history", help=history_help)
    merge.set_defaults(func=_history_merge)


def also_usage(parser: argparse.ArgumentParser, *forms: str) -> None:
    """Add the forms a command's own parser does not see (`devpool shard verify ...`)."""
    usage = parser.format_usage().removeprefix("usage: ").rstrip().replace("%", "%%")
    indent = "\n" + " " * len("usage: ")
    parser.usage = usage + "".join(f"{indent}{parser.prog} {form}" for form in forms)
