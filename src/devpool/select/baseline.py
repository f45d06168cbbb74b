"""Baselines: immutable generations, each a manifest and a dependency database.

A generation lives in .devpool/select/<bucket id>/<generation id>/ as manifest.json and
deps.json. It is written in a temporary folder and renamed into place, so a reader never
sees half of one; nothing rewrites it afterwards. The manifest says what the baseline is
valid for (bucket, platform, runtime shape and identity, compatibility inputs, commit)
and holds the database's sha256. `export_generation` writes one as a tar file; archive.py
reads archives back (`Store.place` takes each generation in).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devpool.select.checkout import BaselineProblem as BaselineProblem
from devpool.select.checkout import changed_since as changed_since
from devpool.select.checkout import git as git
from devpool.select.checkout import git_ignored as git_ignored
from devpool.select.checkout import source_state as source_state
from devpool.select.fingerprints import (
    TOP,
    BlockCache,
    ModuleBlocks,
    file_hash,
    library_stamp,
    project_rel,
)

# identity.py's names, also importable from here, where they lived first
from devpool.select.identity import VERSION_FILES as VERSION_FILES
from devpool.select.identity import identity as identity
from devpool.select.identity import identity_key as identity_key
from devpool.select.identity import toolkits as toolkits
from devpool.select.options import DEFAULT_KEEP, SelectOptions

SCHEMA = 2  # 2: a test's marks are its own block, not the module's top level
MANIFEST, DATABASE = "manifest.json", "deps.json"
_RANK = {"passed": 0, "skipped": 1, "failed": 2}  # the worst of a test's attempts counts


@dataclass(frozen=True)
class Bucket:
    """The part of the suite a baseline covers: paths (relative to the rootdir), -m, -k."""

    paths: tuple[str, ...]
    markexpr: str = ""
    keyword: str = ""

    @property
    def id(self) -> str:
        text = json.dumps([self.paths, self.markexpr, self.keyword])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "paths": list(self.paths),
            "markexpr": self.markexpr,
            "keyword": self.keyword,
        }


def bucket_of(root: Path, cwd: Path, args: Sequence[str], markexpr: str, keyword: str) -> Bucket:
    """The bucket of a pytest command line: its paths made relative to the rootdir."""
    paths = set()
    for arg in args or ["."]:
        path, sep, rest = arg.partition("::")
        rel = os.path.relpath(os.path.abspath(os.path.join(cwd, path)), root).replace(os.sep, "/")
        paths.add(rel + sep + rest)
    return Bucket(tuple(sorted(paths)), markexpr or "", keyword or "")


_SKIP_DIRS = {".git", ".devpool", "__pycache__", ".tox", "node_modules", "site-packages"}


def compatibility_inputs(
    root: Path, bucket: Bucket, options: SelectOptions, inifile: str | None
) -> dict[str, str | None]:
    """Files whose change voids the baseline: conftest.py files of the bucket's ancestors
    (and, for a folder, those below it), the inifile and the [tool.devpool.select] inputs."""
    found: set[Path] = set()
    for entry in bucket.paths:
        target = (root / entry.partition("::")[0]).resolve()
        folder = target if target.is_dir() else target.parent
        for parent in (folder, *folder.parents):
            if parent == root or root in parent.parents:
                found.add(parent / "conftest.py")
        if target.is_dir():
            for dirpath, dirnames, filenames in os.walk(target):
                dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS and not d.startswith(".")]
                if "conftest.py" in filenames:
                    found.add(Path(dirpath) / "conftest.py")
    if inifile:
        found.add(root / inifile)
    for pattern in options.inputs:
        found.update(p for p in root.glob(pattern) if p.is_file())
    result: dict[str, str | None] = {}
    for path in found:
        rel = project_rel(root, str(path))
        if rel is not None and path.is_file():
            result[rel] = file_hash(path)
    return result


def union_deps(many: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One test's dependencies seen by several processes (attempts, a multi-node test's
    ranks): the union. A block or file seen with two hashes is "conflict", never equal again;
    a library keeps its first stamp (the controller hashes the library itself)."""
    merged = dict(many[0])
    for kind in ("blocks", "files", "libs"):
        if kind in merged:
            merged[kind] = dict(merged[kind])
    for deps in many[1:]:
        if not deps.get("recorded") or not merged.get("recorded"):
            merged["recorded"], merged["why"] = False, merged.get("why") or deps.get("why")
            continue
        if "spots" in deps or "spots" in merged:  # ranks not yet resolved into blocks
            both = {tuple(spot) for spot in [*merged.get("spots", []), *deps.get("spots", [])]}
            merged["spots"] = sorted(both)
        for kind in ("blocks", "files"):
            for key, value in deps.get(kind, {}).items():
                if merged[kind].setdefault(key, value) != value:
                    merged[kind][key] = "conflict"  # changed during the run
        for path, stamp in deps.get("libs", {}).items():
            merged["libs"].setdefault(path, stamp)
        merged["globs"] = sorted({*merged.get("globs", []), *deps.get("globs", [])})
        merged["unseen"] = merged.get("unseen") or deps.get("unseen") or ""
    return merged


class Builder:
    """The controller gathers each test's dependencies here, then writes one generation."""

    def __init__(self, root: Path, own: tuple[str, ...] = ()) -> None:
        self.root = root
        self.own = own  # devpool's run and lock folders in the project: never inputs
        self.tests: dict[str, dict[str, Any]] = {}
        self.code = BlockCache(root)
        # A file is parsed once per run: its blocks are those of the source as the run
        # began, as the workers imported it, even if the file changes later.
        self._modules: dict[str, ModuleBlocks | None] = {}
        self._block_of: dict[tuple[str, int], tuple[str, str] | None] = {}
        self._parsing = threading.Lock()  # warm() in a thread, _blocks() in the loop

    def warm(self, filenames: Iterable[str]) -> None:
        """Parse the project's Python files among these ahead of the reports that need them."""
        for filename in filenames:
            rel = project_rel(self.root, filename)
            if rel is not None and rel.endswith(".py"):
                self._module(rel)

    def _module(self, rel: str) -> ModuleBlocks | None:
        with self._parsing:
            if rel not in self._modules:
                self._modules[rel] = self.code.blocks(rel)
            return self._modules[rel]

    def add(self, deps: Mapping[str, Any], outcome: str, devices: int) -> None:
        """One attempt's dependencies (a worker's devpool_deps) and its outcome."""
        deps = self._blocks(self._here(deps))
        if self.own and isinstance(deps.get("files"), Mapping):
            files = {k: v for k, v in deps["files"].items() if not str(k).startswith(self.own)}
            deps = {**deps, "files": files}
        nodeid = str(deps["nodeid"])
        test = self.tests.get(nodeid)
        if test is None:
            self.tests[nodeid] = {"outcome": outcome, "devices": devices, **deps}
            return
        if _RANK.get(outcome, 2) > _RANK.get(test["outcome"], 2):
            test["outcome"] = outcome
        test.update(union_deps([test, deps]))

    def _blocks(self, deps: Mapping[str, Any]) -> Mapping[str, Any]:
        """The blocks where the worker's spots (file, first line; 0: the module's top) lie."""
        if "spots" not in deps:
            return deps
        blocks = dict(deps.get("blocks", {}))
        for rel, line in deps["spots"]:
            spot = (str(rel), int(line))
            if spot not in self._block_of:
                module = self._module(spot[0])
                if module is None:  # gone, or not text
                    self._block_of[spot] = None
                else:
                    key = module.key(TOP) if not spot[1] else module.block_at(spot[1])
                    self._block_of[spot] = (key, module.hashes[key])
            block = self._block_of[spot]
            if block is not None:
                blocks[block[0]] = block[1]
        return {key: value for key, value in deps.items() if key != "spots"} | {"blocks": blocks}

    def _here(self, deps: Mapping[str, Any]) -> Mapping[str, Any]:
        """A library the worker named relative to its rootdir (one inside the project) is
        the file at that place under this rootdir, stamped here: a Ray worker with shipped
        code ran a copy of it elsewhere."""
        libs = deps.get("libs")
        if not isinstance(libs, Mapping) or all(os.path.isabs(p) for p in libs):
            return deps
        here: dict[str, Any] = {}
        for path, stamp in libs.items():
            if os.path.isabs(path):
                here[path] = stamp
            else:
                local = str(self.root / path)
                here[local] = library_stamp(local)
        return {**deps, "libs": here}

    def database(self, lib_hashes: Mapping[str, str | None]) -> dict[str, Any]:
        """The deps.json content: each fingerprint once, tests point at them by index."""
        tables: dict[str, dict[tuple[Any, ...], int]] = {"blocks": {}, "files": {}, "libs": {}}
        tests: dict[str, Any] = {}
        # What git ignores (a cache, a build output) is no input, even where a test read it.
        read = {rel for test in self.tests.values() for rel in test.get("files", {})}
        ignored = git_ignored(self.root, read)
        for nodeid, test in sorted(self.tests.items()):
            entry: dict[str, Any] = {
                "outcome": test["outcome"],
                "devices": test["devices"],
                "recorded": bool(test.get("recorded")),
                "why": test.get("why") or "",
            }
            if entry["recorded"]:
                for kind in ("blocks", "files"):
                    table = tables[kind]
                    entry[kind] = [
                        table.setdefault((k, v), len(table))
                        for k, v in sorted(test[kind].items())
                        if k not in ignored
                    ]
                libs = tables["libs"]
                entry["libs"] = [
                    libs.setdefault(
                        (
                            library_name(self.root, path),
                            *(stamp or (None, None)),
                            lib_hashes.get(path),
                        ),
                        len(libs),
                    )
                    for path, stamp in sorted(test["libs"].items())
                ]
                entry["globs"] = list(test.get("globs", []))
                if test.get("unseen"):  # what a process below it ran is not known
                    entry["unseen"] = test["unseen"]
            tests[nodeid] = entry
        return {kind: [list(key) for key in table] for kind, table in tables.items()} | {
            "tests": tests
        }

    def library_paths(self) -> set[str]:
        """Every shared library any test had mapped."""
        return {path for test in self.tests.values() for path in test.get("libs", {})}


def library_name(root: Path, path: str) -> str:
    """How a baseline names a library: relative to the rootdir when it lies inside it (a
    project's own build, a virtual environment in the checkout), so that a baseline recorded
    in one checkout reads the same library in another; else its absolute path."""
    base = str(root) + os.sep
    return path[len(base) :].replace(os.sep, "/") if path.startswith(base) else path


def library_path(root: Path, name: str) -> str:
    """The file a baseline's library name means under this rootdir (library_name's inverse)."""
    return name if os.path.isabs(name) else str(root / name)


def library_hashes(store: Path, paths: Iterable[str]) -> dict[str, str | None]:
    """Content hashes of shared libraries, cached on (path, size, mtime) beside the store."""
    cache_path = store / "library-hashes.json"
    try:
        cache = json.loads(cache_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        cache = {}
    result: dict[str, str | None] = {}
    kept: dict[str, str | None] = {}  # only the libraries of this run: the cache stays small
    for path in paths:
        stamp = library_stamp(path)
        key = f"{path}|{stamp}"
        if key not in cache:
            cache[key] = file_hash(Path(path)) if stamp else None
        result[path] = kept[key] = cache[key]
    store.mkdir(parents=True, exist_ok=True)
    _write_atomic(cache_path, json.dumps(kept).encode())
    return result


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class Store:
    """The generations of every bucket under <rootdir>/.devpool/select."""

    def __init__(self, path: Path, keep: int = DEFAULT_KEEP) -> None:
        self.path = path
        self.keep = keep  # generations kept per bucket ([tool.devpool.select] keep)

    def write(self, manifest: dict[str, Any], database: Mapping[str, Any]) -> Path:
        """Write one generation: a temporary folder renamed into place, never rewritten."""
        data = json.dumps(database, separators=(",", ":"), sort_keys=True).encode()
        now = time.time()  # ids sort by time: the newest generation is the last name
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now))
        generation = f"{stamp}.{int(now * 1e6) % 1000000:06d}Z-{uuid.uuid4().hex[:6]}"
        manifest = {
            **manifest,
            "generation": generation,
            "created": time.time(),
            "db_sha256": hashlib.sha256(data).hexdigest(),
        }
        folder: Path = self.path / str(manifest["bucket"]["id"])
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".tmp-{generation}"
        tmp.mkdir()
        (tmp / DATABASE).write_bytes(data)
        (tmp / MANIFEST).write_text(
            json.dumps(manifest, indent=1, sort_keys=True), encoding="utf-8"
        )
        os.rename(tmp, folder / generation)
        self._drop_oldest(folder)
        return folder / generation

    def _drop_oldest(self, folder: Path) -> None:
        """All but the newest `keep` generations of a bucket removed (ids sort by time): each
        renamed aside first, so that a reader finds a whole generation or none."""
        names = _generations(folder)
        for name in names[: max(0, len(names) - self.keep)]:
            aside = folder / f".old-{name}"
            try:
                os.rename(folder / name, aside)
            except OSError:
                continue  # another run dropped it first
            shutil.rmtree(aside, ignore_errors=True)

    def latest(self, bucket_id: str) -> Path | None:
        """The newest generation of a bucket (ids sort by time); None when it has none."""
        folder = self.path / bucket_id
        names = _generations(folder) if folder.is_dir() else []
        return folder / names[-1] if names else None

    def newest(
        self, bucket_id: str, key: str, pin: str | None = None
    ) -> tuple[str, bytes, bytes] | None:
        """The newest generation of a bucket: (id, manifest, database bytes); None when it
        has none. A folder holds one project's baselines: the identity is checked on reading."""
        generation = self.latest(bucket_id)
        if generation is None:
            return None
        try:
            return (
                generation.name,
                (generation / MANIFEST).read_bytes(),
                (generation / DATABASE).read_bytes(),
            )
        except OSError as exc:
            raise BaselineProblem(f"baseline {generation.name} cannot be read: {exc}") from None

    def place(self, manifest_bytes: bytes, database_bytes: bytes, where: str) -> Path:
        """A generation read from elsewhere (an import), checked first, into the store;
        returns its folder. Its ids are plain names (check_generation), so it lands inside."""
        manifest, _ = check_generation(manifest_bytes, database_bytes, where)
        folder: Path = self.path / manifest["bucket"]["id"]
        target: Path = folder / manifest["generation"]
        if target.exists():
            return target
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".tmp-{uuid.uuid4().hex}"
        tmp.mkdir()
        (tmp / MANIFEST).write_bytes(manifest_bytes)
        (tmp / DATABASE).write_bytes(database_bytes)
        os.rename(tmp, target)
        return target


def export_generation(generation: Path, archive: Path) -> None:
    """Write one generation as a tar file (manifest.json and deps.json)."""
    with tarfile.open(archive, "w:gz") as tar:
        for name in (MANIFEST, DATABASE):
            data = (generation / name).read_bytes()
            info = tarfile.TarInfo(f"{generation.name}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def load_generation(generation: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read and check a generation, without writing anything; BaselineProblem says why not."""
    try:
        manifest_bytes = (generation / MANIFEST).read_bytes()
        database_bytes = (generation / DATABASE).read_bytes()
    except OSError as exc:
        raise BaselineProblem(f"baseline {generation.name} cannot be read: {exc}") from None
    return check_generation(manifest_bytes, database_bytes, f"baseline {generation.name}")


def _generations(folder: Path) -> list[str]:
    """A bucket folder's generation ids, the oldest first (ids sort by time)."""
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def check_generation(
    manifest_bytes: bytes, database_bytes: bytes, where: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    try:
        manifest = json.loads(manifest_bytes)
    except ValueError:
        raise BaselineProblem(f"{where}: its manifest is damaged (not JSON)") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        raise BaselineProblem(
            f"{where}: schema {manifest.get('schema') if isinstance(manifest, dict) else '?'}"
            f" is not devpool's baseline schema {SCHEMA}"
        )
    _check_names(manifest, where)
    if hashlib.sha256(database_bytes).hexdigest() != manifest.get("db_sha256"):
        raise BaselineProblem(f"{where}: its database is damaged (checksum mismatch)")
    try:
        database = json.loads(database_bytes)
        tests = database["tests"]
        assert isinstance(tests, dict)
        assert all(isinstance(database[k], list) for k in ("blocks", "files", "libs"))
    except (ValueError, KeyError, AssertionError, TypeError):
        raise BaselineProblem(f"{where}: its database is damaged (unreadable)") from None
    return manifest, database


# A bucket or generation id names a folder of the store: a plain name, never a path.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def _check_names(manifest: Mapping[str, Any], where: str) -> None:
    """The manifest's bucket and generation ids, checked before any path is built of them."""
    bucket = manifest.get("bucket")
    if not isinstance(bucket, dict) or not plain_name(bucket.get("id")):
        raise BaselineProblem(f"{where}: its manifest names no valid bucket id")
    if not plain_name(manifest.get("generation")):
        raise BaselineProblem(f"{where}: its manifest names no valid generation id")
    paths = bucket.get("paths")
    if not isinstance(paths, list) or not all(isinstance(path, str) for path in paths):
        raise BaselineProblem(f"{where}: its manifest's bucket has no list of paths")
    if not all(isinstance(bucket.get(key, ""), str) for key in ("markexpr", "keyword")):
        raise BaselineProblem(f"{where}: its manifest's bucket -m or -k is not text")


def plain_name(value: object) -> bool:
    """A bucket or generation id that can name a folder of the store, and nothing else."""
    return isinstance(value, str) and bool(_PLAIN_NAME.fullmatch(value)) and ".." not in value
