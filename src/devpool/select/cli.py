"""`devpool select`: what a run with --devpool-select on would run, and why; export/import.

    devpool select [--base REV] [--explain] [-m EXPR] [-k EXPR] [PATH ...]
    devpool select export ARCHIVE [-m EXPR] [-k EXPR] [PATH ...]   (none: every bucket)
    devpool select import ARCHIVE

The bucket (PATHs, -m, -k) must be spelled as the pytest command line that recorded it.
"""

from __future__ import annotations

import argparse
import glob
from pathlib import Path
from typing import Any

from devpool.capacity.cli import also_usage
from devpool.config import check_tables, read_table
from devpool.errors import DevpoolError
from devpool.project import find_pyproject
from devpool.select.archive import bucket_words, import_archive, write_archive
from devpool.select.baseline import (
    BaselineProblem,
    Bucket,
    Store,
    bucket_of,
    identity,
)
from devpool.select.diff import Current, select
from devpool.select.options import SelectOptions, select_options
from devpool.select.session import store_for


def _project(cwd: Path) -> tuple[Path, SelectOptions]:
    """The rootdir (the folder of the nearest pyproject.toml, else here) and its options."""
    pyproject = find_pyproject(cwd)
    root = pyproject.parent if pyproject is not None else cwd
    table = read_table(pyproject)
    check_tables(table, str(pyproject))  # every [tool.devpool…] table, as a run checks them
    return root, select_options(table, str(pyproject))


def _bucket(args: argparse.Namespace, root: Path, cwd: Path) -> Bucket:
    paths = args.paths or testpaths(cwd)
    return bucket_of(root, cwd, paths, args.markexpr or "", args.keyword or "")


def testpaths(cwd: Path) -> list[str]:
    """What pytest runs with no path given here: its testpaths, as capacity and shard use.

    pytest's own determine_setup finds the ini file; testpaths apply only where pytest is
    started in its rootdir, and their globs are read from there. [] means `.`."""
    try:
        from _pytest.config.findpaths import determine_setup

        root, _, ini, *_ = determine_setup(
            inifile=None, override_ini=None, args=[], rootdir_cmd_arg=None, invocation_dir=cwd
        )
    except Exception:  # noqa: BLE001 - pytest's inner API moved: `.`, as before
        return []
    raw: Any = ini.get("testpaths")
    raw = getattr(raw, "value", raw)
    if root != cwd or not raw:
        return []
    patterns = raw.split() if isinstance(raw, str) else [str(p) for p in raw]
    return [
        p for pattern in patterns for p in sorted(glob.iglob(pattern, root_dir=cwd, recursive=True))
    ]


def _select(args: argparse.Namespace) -> int:
    cwd = Path.cwd()
    root, options = _project(cwd)
    current = Current(
        root=root,
        bucket=_bucket(args, root, cwd),
        options=options,
        identity=identity(options.key_packages),
        rev=args.base,
    )
    selection = select(store_for(root), current)
    print(f"devpool select: {selection.summary()}")
    if selection.full_reason is not None:
        return 0
    for nodeid, why in sorted(selection.selected.items()):
        print(f"selected    {nodeid}" + (f": {why}" if args.explain else ""))
    if args.explain:
        for nodeid, why in sorted(selection.deselected.items()):
            print(f"deselected  {nodeid}: {why}")
        for note in selection.notes:
            print(f"note        {note}")
    print("tests that are not in the baseline (new ones) run too under --devpool-select on")
    return 0


def _export(args: argparse.Namespace) -> int:
    cwd = Path.cwd()
    root, _ = _project(cwd)
    store = store_for(root)
    newest = _newest_of_every_bucket(store)
    if args.paths or args.markexpr or args.keyword:
        bucket = _bucket(args, root, cwd)
        generation = store.latest(bucket.id)
        if generation is None:
            raise DevpoolError(
                f"no baseline for the bucket {' '.join(bucket.paths)} to export"
                + _buckets_that_exist(newest)
            )
        chosen = [generation]
    else:  # no bucket named: every bucket's newest, whatever command line recorded it
        if not newest:
            raise DevpoolError(
                f"no baseline to export in {store.path}: a run with --devpool-select=record "
                "writes one"
            )
        chosen = newest
    write_archive(chosen, Path(args.archive))
    for generation in chosen:
        print(
            f"devpool select: exported baseline {generation.name} "
            f"({bucket_words(generation)}) to {args.archive}"
        )
    return 0


def _newest_of_every_bucket(store: Store) -> list[Path]:
    if not store.path.is_dir():
        return []
    newest = (store.latest(folder.name) for folder in sorted(store.path.iterdir()))
    return [generation for generation in newest if generation is not None]


def _buckets_that_exist(newest: list[Path]) -> str:
    if not newest:
        return "; there is no baseline here yet"
    return "; baselines exist for the buckets: " + ", ".join(
        sorted(bucket_words(generation) for generation in newest)
    )


def _import(args: argparse.Namespace) -> int:
    root, _ = _project(Path.cwd())
    if not Path(args.archive).is_file():
        raise DevpoolError(f"{args.archive}: no such file to import")
    try:
        folders = import_archive(store_for(root), Path(args.archive))
    except BaselineProblem as exc:
        raise DevpoolError(str(exc)) from None
    for folder in folders:
        print(f"devpool select: imported baseline {folder.name}")
    return 0


def _bucket_arguments(
    parser: argparse.ArgumentParser, default: str = "testpaths, as pytest's"
) -> None:
    parser.add_argument("-m", dest="markexpr", default="", help="the run's -m expression")
    parser.add_argument("-k", dest="keyword", default="", help="the run's -k expression")
    parser.add_argument("paths", nargs="*", help=f"the run's test paths (default: {default})")


def add_select_command(commands: Any) -> None:
    """`devpool select` on the devpool command's subparsers."""
    parser = commands.add_parser(
        "select",
        help="which tests a change can affect, from the newest baseline; "
        "`devpool select export|import ARCHIVE` moves a baseline between machines",
    )
    parser.add_argument("--base", default="HEAD", help="the baseline's commit must precede it")
    parser.add_argument("--explain", action="store_true", help="say why for every test")
    _bucket_arguments(parser)
    parser.set_defaults(func=_select)
    also_usage(parser, "export ARCHIVE [-m EXPR] [-k EXPR] [PATH ...]", "import ARCHIVE")


def build_transfer_parser(parser_class: type[argparse.ArgumentParser], verb: str) -> Any:
    """`devpool select export|import ARCHIVE` (their own parsers: select takes paths)."""
    what = {
        "export": "Write the newest baseline generation of the run's bucket (paths, -m, -k) "
        "to ARCHIVE; with none of them, the newest of every bucket.",
        "import": "Add the baseline generations in ARCHIVE to this project's baselines.",
        "merge": "Publish the baseline of a recording split into shards, once every shard's "
        "part is there.",
    }
    parser = parser_class(prog=f"devpool select {verb}", description=what.get(verb))
    if verb == "merge":
        from devpool.select.shards import add_merge_arguments

        add_merge_arguments(parser)
        return parser
    parser.add_argument("archive", help="the .tar.gz file of the generations")
    if verb == "export":
        _bucket_arguments(parser, "every bucket")
        parser.set_defaults(func=_export)
    else:
        parser.set_defaults(func=_import)
    return parser
