"""One recording spread over many jobs: the queue's jobs, or a suite's shards.

Each job sends the tests it ran as self-contained entries (a test's blocks, files, globs
and libraries with their hashes, nothing that points into a job's own tables), a part of
the run. Under the queue a job sends its tests' entries before it reports their outcomes
(QueueSource.before_flush): a test the queue has as ended has its entry, and a job killed
before sending is a job whose tests go back to the queue and are recorded where they rerun.
The generation is made of every part once the run is complete, and published once
(store_pg.PgStore.write with the run); a test sent twice keeps one entry.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from devpool.errors import DevpoolError
from devpool.select.baseline import Builder, library_hashes, library_name
from devpool.select.store_pg import PgStore
from devpool.wording import counted

_KEPT = ("outcome", "devices", "recorded", "why", "blocks", "files", "globs", "unseen")
_TABLED = ("blocks", "files")  # indices into a packed batch's tables
SHARD_MARK = "::shard "  # a part row naming one shard and its manifest (no node id starts so)
POOL_MARK = "::pool "  # a part row naming the runner shape of a job that sent tests


def pool_mark(platform: str, pool: int) -> dict[str, Any]:
    """The marks that say a job of this platform and pool size recorded tests of the run."""
    return {f"{POOL_MARK}{platform} {pool}": [platform, pool]}


def shapes_of(marks: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(platform, pool size) of every job of the run that recorded tests."""
    return sorted({(str(v[0]), int(v[1])) for key, v in marks.items() if key.startswith(POOL_MARK)})


def entry_of(
    root: Path, test: Mapping[str, Any], hashes: Mapping[str, str | None]
) -> dict[str, Any]:
    """A test as Builder keeps it, made self-contained: its libraries named as a baseline
    names them (library_name), each with its stamp and content hash."""
    entry = {key: test[key] for key in _KEPT if key in test}
    entry["libs"] = {
        library_name(root, path): [*(stamp or (None, None)), hashes.get(path)]
        for path, stamp in test.get("libs", {}).items()
    }
    return entry


def database_of(root: Path, entries: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The deps.json content of a generation made of many jobs' entries."""
    builder = Builder(root)
    hashes: dict[str, str | None] = {}
    for nodeid, entry in entries.items():
        libs: dict[str, Any] = {}
        for name, (size, mtime, digest) in entry.get("libs", {}).items():
            libs[name] = (size, mtime) if size is not None else None
            hashes[name] = digest
        builder.tests[nodeid] = {**entry, "libs": libs}
    return builder.database(hashes)


def pack_part(
    root: Path, entries: Mapping[str, Mapping[str, Any]], marks: Mapping[str, Any] | None = None
) -> bytes:
    """A batch of entries as one compressed body: shaped as a generation's database, each
    block, file and library once (most tests of a batch share them). marks: a shard's
    manifest under its SHARD_MARK name."""
    body = {"db": database_of(root, entries), "marks": dict(marks or {})}
    return zlib.compress(json.dumps(body, separators=(",", ":")).encode(), 1)


def unpack_parts(bodies: Iterable[bytes]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The entries of every batch, the last sent of a test kept; and the marks."""
    entries: dict[str, dict[str, Any]] = {}
    marks: dict[str, Any] = {}
    for raw in bodies:
        body = json.loads(zlib.decompress(raw))
        marks.update(body["marks"])
        db = body["db"]
        blocks, files, libs = db["blocks"], db["files"], db["libs"]
        for nodeid, test in db["tests"].items():
            entry = {key: test[key] for key in _KEPT if key in test and key not in _TABLED}
            if test.get("recorded"):
                entry["blocks"] = dict(blocks[i] for i in test["blocks"])
                entry["files"] = dict(files[i] for i in test["files"])
                entry["libs"] = {libs[i][0]: libs[i][1:] for i in test["libs"]}
            entries[nodeid] = entry
    return entries, marks


class JobPart:
    """This job's part of a recording across jobs: the entries not sent yet."""

    def __init__(self, root: Path, builder: Builder, hashes_at: Path) -> None:
        self.root = root
        self.builder = builder
        self.hashes_at = hashes_at  # the folder of the library hash cache
        self.sent: set[str] = set()
        self.hashes: dict[str, str | None] = {}
        self.error = ""
        self.marks: dict[str, Any] = {}  # sent with every batch: the job's runner shape

    def unsent(self) -> dict[str, dict[str, Any]]:
        """Entries of the tests recorded since the last send."""
        tests = self.builder.tests
        fresh = [nodeid for nodeid in tests if nodeid not in self.sent]
        libs = {p for nodeid in fresh for p in tests[nodeid].get("libs", {})} - set(self.hashes)
        if libs:
            self.hashes.update(library_hashes(self.hashes_at, libs))
        return {nodeid: entry_of(self.root, tests[nodeid], self.hashes) for nodeid in fresh}

    def send(self, store: PgStore, run: str) -> None:
        """Send what is unsent; a failure is kept (the run's generation then lacks tests and
        is not published), never raised into the run loop."""
        entries = self.unsent()
        if not entries or self.error:
            return
        try:
            store.send_parts(run, pack_part(self.root, entries, self.marks))
        except DevpoolError as exc:
            self.error = str(exc)
            return
        self.sent.update(entries)


def missing(required: Iterable[str], entries: Mapping[str, Any]) -> str:
    """'' when every required test has an entry; else why the run cannot be published."""
    lacking = [test for test in required if test not in entries]
    if not lacking:
        return ""
    return (
        f"{counted(len(lacking), 'test')} of the run "
        f"{'has' if len(lacking) == 1 else 'have'} no recorded dependencies "
        f"(e.g. {lacking[0]}): a job that ran them did not send them"
    )


def shard_file(folder: Path, run: str, shard: tuple[int, int]) -> Path:
    """Where a shard writes its part when the baselines are files."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in run)
    return folder / "parts" / safe / f"{shard[0]}-of-{shard[1]}.json"


def write_shard_file(
    path: Path, manifest: Mapping[str, Any], shard: tuple[int, int], entries: Mapping[str, Any]
) -> None:
    """One shard's part as a file: its manifest, its shard and its tests' entries."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"manifest": manifest, "shard": list(shard), "tests": entries})
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
