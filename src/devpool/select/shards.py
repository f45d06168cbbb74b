"""A recording split into shards (--devpool-shard=i/n): each shard writes its part, and a
merge step publishes the bucket's generation once every shard's part is there.

    devpool select merge PART.json ...                        (parts as files)
    devpool select merge --devpool-history=URL --devpool-queue-run=ID   (parts in PostgreSQL)

A part is the shard's manifest and its tests' self-contained entries (fleet.py). Files go
to .devpool/select/parts/RUN/i-of-n.json, for the workflow to carry to the merge step;
with a PostgreSQL history they are rows of the run in the database, and nothing is carried.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from devpool.errors import DevpoolError
from devpool.select.fleet import (
    SHARD_MARK,
    JobPart,
    database_of,
    pack_part,
    shard_file,
    unpack_parts,
    write_shard_file,
)
from devpool.select.store_pg import PgStore


def write_part(
    store: Any, run: str | None, shard: tuple[int, int], manifest: dict[str, Any], part: JobPart
) -> str:
    """This shard's part, to the database or to a file; the line the terminal shows."""
    entries = part.unsent()
    mark = f"{SHARD_MARK}{shard[0]}/{shard[1]}"
    if isinstance(store, PgStore):
        assert run is not None
        store.send_parts(run, pack_part(part.root, entries, {mark: manifest}))
        return (
            f"shard {shard[0]}/{shard[1]}'s part of the baseline ({len(entries)} tests) is in "
            f"{store.where} under run {run!r}; `devpool select merge "
            f"--devpool-queue-run={run}` publishes the run's once every shard's is there"
        )
    path = shard_file(store.path, run or "shards", shard)
    write_shard_file(path, manifest, shard, entries)
    return (
        f"shard {shard[0]}/{shard[1]}'s part of the baseline ({len(entries)} tests) is "
        f"{path}; `devpool select merge PART ...` publishes the shards' parts"
    )


def merged(
    parts: Mapping[tuple[int, int], Mapping[str, Any]], tests: Mapping[str, Any], where: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The manifest (shard 1's) and the tests of a complete set of shards; DevpoolError
    naming the shards that are missing or of another bucket."""
    if not parts:
        raise DevpoolError(f"no shard's part of a baseline in {where}")
    counts = {n for _, n in parts}
    if len(counts) != 1:
        raise DevpoolError(f"the parts in {where} come from splits into {sorted(counts)} shards")
    (total,) = counts
    lacking = [f"{i}/{total}" for i in range(1, total + 1) if (i, total) not in parts]
    if lacking:
        raise DevpoolError(f"{where} lacks the part of shard {', '.join(lacking)}")
    first = dict(parts[(1, total)])
    buckets = {part["bucket"]["id"] for part in parts.values()}
    if len(buckets) != 1:
        raise DevpoolError(f"the shards' parts in {where} record different buckets")
    return first, dict(tests)


def _from_files(paths: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    parts: dict[tuple[int, int], Any] = {}
    tests: dict[str, Any] = {}
    for name in paths:
        try:
            data = json.loads(Path(name).read_text(encoding="utf-8"))
            shard = (int(data["shard"][0]), int(data["shard"][1]))
            parts[shard] = data["manifest"]
            tests.update(data["tests"])
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            raise DevpoolError(f"{name} is not a shard's part of a devpool baseline") from None
    return merged(parts, tests, " ".join(paths))


def _from_database(store: PgStore, run: str) -> tuple[dict[str, Any], dict[str, Any]]:
    parts: dict[tuple[int, int], Any] = {}
    tests, marks = unpack_parts(store.parts(run))
    for mark, manifest in marks.items():
        if mark.startswith(SHARD_MARK):  # a queue recording's jobs mark their runner shape
            index, _, total = mark[len(SHARD_MARK) :].partition("/")
            parts[(int(index), int(total))] = manifest
    if tests and not parts:
        raise DevpoolError(
            f"run {run!r} in {store.where} was recorded through the queue, not in shards: "
            "its last job publishes it"
        )
    return merged(parts, tests, f"run {run!r} in {store.where}")


def merge(args: argparse.Namespace) -> int:
    """`devpool select merge`: publish the generation of a complete set of shards' parts."""
    from devpool.select.location import Project

    store = Project(Path.cwd(), args.history).store
    if args.parts:
        manifest, tests = _from_files(args.parts)
        run = None
    elif isinstance(store, PgStore):
        if not args.queue_run:
            raise DevpoolError("devpool select merge needs --devpool-queue-run=ID, the shards' run")
        run = str(args.queue_run)
        manifest, tests = _from_database(store, run)
    else:
        raise DevpoolError(
            "devpool select merge needs the shards' PART files, or "
            "--devpool-history=postgresql://… and --devpool-queue-run=ID where the shards sent "
            "their parts"
        )
    database = database_of(Path.cwd(), tests)
    written: Path | str | None
    if isinstance(store, PgStore) and run:
        written = store.write(manifest, database, run=run)
    else:
        written = store.write(manifest, database)
    if written is None:
        print(f"devpool select: run {run!r}'s baseline was published already")
        return 0
    name = written if isinstance(written, str) else written.name
    print(f"devpool select: published baseline {name} ({len(tests)} tests, every shard's part)")
    return 0


def add_merge_arguments(parser: argparse.ArgumentParser) -> None:
    """`devpool select merge`'s arguments."""
    parser.add_argument("parts", nargs="*", metavar="PART", help="the shards' part files")
    parser.add_argument(
        "--devpool-history",
        dest="history",
        metavar="URL",
        help="publish to (and, with no PART, read the parts from) this PostgreSQL history",
    )
    parser.add_argument(
        "--devpool-queue-run", dest="queue_run", metavar="ID", help="the shards' run"
    )
    parser.set_defaults(func=merge)
