"""`devpool select`: what a run with --devpool-select on would run, and why; export/import.

    devpool select [--base REV] [--explain] [-m EXPR] [-k EXPR] [PATH ...]
    devpool select export ARCHIVE [-m EXPR] [-k EXPR] [PATH ...]   (none: every bucket)
    devpool select import ARCHIVE

The bucket (PATHs, -m, -k) must be spelled as the pytest command line that recorded it.
Each reads the baselines where a run would: the fleet's PostgreSQL when
--devpool-history (or [tool.devpool] history) is a postgresql:// URL, else the project's
.devpool/select. In the database a bucket has a generation per runner shape; `--devices`
names the shape to select for, as the run's --devices would.
"""

from __future__ import annotations

import argparse
import glob
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devpool.capacity.cli import also_usage
from devpool.errors import DevpoolError
from devpool.select.archive import (
    Generation,
    bucket_words,
    import_archive,
    manifest_words,
    of_folder,
    read_archive,
    write_archive,
)
from devpool.select.baseline import (
    BaselineProblem,
    Bucket,
    Store,
    bucket_of,
    identity,
    identity_key,
)
from devpool.select.diff import Current, select
from devpool.select.location import Project
from devpool.wording import counted

if TYPE_CHECKING:
    from devpool.select.store_pg import PgStore

Shape = tuple[Any, Any]  # (platform, pool size) of a runner; (None, None): not known


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
    project = Project(cwd, args.history)
    bucket = _bucket(args, project.root, cwd)
    ident = identity(project.options.key_packages)
    (platform, pool), shape_note = _shape(project, bucket, ident, args.devices)
    current = Current(
        root=project.root,
        bucket=bucket,
        options=project.options,
        identity=ident,
        rev=args.base,
        platform=platform,
        pool=pool,
    )
    selection = select(project.store, current)
    print(f"devpool select: {selection.summary()}")
    if shape_note:
        print(f"devpool select: {shape_note}")
    if selection.full_reason is not None:
        return 0
    for nodeid, why in sorted(selection.selected.items()):
        print(f"selected    {nodeid}" + (f": {why}" if args.explain else ""))
    if args.explain:
        for nodeid, why in sorted(selection.deselected.items()):
            print(f"deselected  {nodeid}: {why}")
        for note in selection.notes:
            print(f"note        {note}")
    print(
        "tests the run collects that are not in the baseline (new ones, or ones the recording "
        "run did not run) run too under --devpool-select on, each said with -v"
    )
    return 0


def _shape(project: Project, bucket: Bucket, ident: Any, devices: str | None) -> tuple[Shape, str]:
    """The runner shape (platform, pool size) to select for in a database store, and a note
    on the others it holds; ((None, None), "") for a project's folder, which holds one.

    --devices (else [tool.devpool] devices) names it, as a run's does; without it, the
    newest generation recorded with this machine's identity decides."""
    from devpool.select.store_pg import PgStore

    if not isinstance(project.store, PgStore):
        return (None, None), ""
    configured = project.table.get("devices")
    wanted = _spec_shape(devices or configured, bool(devices))
    try:
        rows = project.store.shapes(bucket.id)
    except DevpoolError:
        return wanted, ""  # select() says why the database cannot be read
    ours: list[Shape] = []  # recorded with this machine's identity, the newest first
    for _, key, manifest in rows:
        shape = (manifest.get("platform"), (manifest.get("shape") or {}).get("pool"))
        if key == identity_key(bucket.id, *shape, ident) and shape not in ours:
            ours.append(shape)
    if rows and not ours:
        return wanted, (
            f"this bucket's baselines in {project.store.where} were all recorded with another "
            "Python, other key packages or drivers than this machine's"
        )
    chosen = wanted if wanted != (None, None) else (ours[0] if ours else wanted)
    others = [_shape_words(shape) for shape in ours if shape != chosen]
    if not others:
        return chosen, ""
    how = "the newest recorded"
    if wanted != (None, None):
        how = "--devices" if devices else "[tool.devpool] devices"
    return chosen, (
        f"runner shape {_shape_words(chosen)} ({how}); {project.store.where} also has "
        f"{', '.join(others)} (choose with --devices)"
    )


def _spec_shape(spec: Any, named: bool) -> Shape:
    """(platform, pool size) of a PLATFORM:IDS spec; (None, None) for another (auto, a bare
    name) from the config; a --devices the user typed must name ids."""
    from devpool.devices.inventory import named_ids

    found = named_ids(str(spec or ""))
    if found is not None:
        return found[0], len(found[1])
    if named:
        raise DevpoolError(
            f"--devices {spec} names no device ids; devpool select needs PLATFORM:IDS "
            "(e.g. cuda:0-7), the runner shape whose baseline to read"
        )
    return None, None


def _shape_words(shape: Shape) -> str:
    return f"{shape[0]} with {counted(int(shape[1] or 0), 'device')}"


def _export(args: argparse.Namespace) -> int:
    cwd = Path.cwd()
    project = Project(cwd, args.history)
    named = bool(args.paths or args.markexpr or args.keyword)
    bucket = _bucket(args, project.root, cwd) if named else None
    try:
        chosen = _chosen(project.store, bucket)
        write_archive(chosen, Path(args.archive))
    except OSError as exc:  # a folder that is not there, a generation a recording dropped
        raise DevpoolError(f"cannot export to {args.archive}: {exc.strerror or exc}") from None
    for name, manifest, _ in chosen:
        words = manifest_words(json.loads(manifest)) if manifest else "?"
        print(f"devpool select: exported baseline {name} ({words}) to {args.archive}")
    return 0


def _chosen(store: Store | PgStore, bucket: Bucket | None) -> list[Generation]:
    """What an export carries: the named bucket's newest (every runner shape's, from a
    database), else every bucket's; DevpoolError naming what exists when there is none."""
    if isinstance(store, Store):
        newest = _newest_of_every_bucket(store)
        if bucket is not None:
            generation = store.latest(bucket.id)
            if generation is None:
                raise DevpoolError(
                    f"no baseline for the bucket {' '.join(bucket.paths)} to export"
                    + _buckets_that_exist(sorted(bucket_words(g) for g in newest))
                )
            return [of_folder(generation)]
        if not newest:
            raise DevpoolError(
                f"no baseline to export in {store.path}: a run with --devpool-select=record "
                "writes one"
            )
        return [of_folder(generation) for generation in newest]
    rows = store.shapes(bucket.id if bucket is not None else None)
    if not rows:
        every = store.shapes() if bucket is not None else []
        where = f"the bucket {' '.join(bucket.paths)}" if bucket is not None else "any bucket"
        raise DevpoolError(
            f"no baseline for {where} to export in {store.where}"
            + _buckets_that_exist(sorted({manifest_words(m) for _, _, m in every}))
        )
    return [store.generation(name) for name, _, _ in reversed(rows)]


def _newest_of_every_bucket(store: Store) -> list[Path]:
    if not store.path.is_dir():
        return []
    newest = (store.latest(folder.name) for folder in sorted(store.path.iterdir()))
    return [generation for generation in newest if generation is not None]


def _buckets_that_exist(words: list[str]) -> str:
    if not words:
        return "; there is no baseline here yet"
    return "; baselines exist for the buckets: " + ", ".join(words)


def _import(args: argparse.Namespace) -> int:
    project = Project(Path.cwd(), args.history)
    archive = Path(args.archive)
    if not archive.is_file():
        raise DevpoolError(f"{args.archive}: no such file to import")
    try:
        if isinstance(project.store, Store):
            for folder in import_archive(project.store, archive):
                print(f"devpool select: imported baseline {folder.name}")
            return 0
        said = {
            "added": "imported baseline {} into {}",
            "present": "baseline {} is already in {}",
            "older": "baseline {} not imported: {} has a newer one of its bucket and runner",
        }
        for name, manifest, database in read_archive(archive):
            done = project.store.add(manifest, database)
            print("devpool select: " + said[done].format(name, project.store.where))
    except BaselineProblem as exc:
        raise DevpoolError(str(exc)) from None
    return 0


def _history_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--devpool-history",
        dest="history",
        metavar="URL",
        help="the fleet's PostgreSQL history the baselines live in "
        "(default: [tool.devpool] history where it is a URL, else .devpool/select)",
    )


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
    parser.add_argument(
        "--devices",
        metavar="PLATFORM:IDS",
        help="the runner shape whose baseline to read from a database, as the run's --devices "
        "(default: [tool.devpool] devices; else the newest recorded)",
    )
    _history_argument(parser)
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
    _history_argument(parser)
    if verb == "export":
        _bucket_arguments(parser, "every bucket")
        parser.set_defaults(func=_export)
    else:
        parser.set_defaults(func=_import)
    return parser
