"""Classify a change against a baseline: which tests it can affect, or why nobody can tell.

Validation is read-only and fails closed: any doubt about the baseline (missing, damaged,
foreign, stale, another identity or compatibility input, a file nothing accounts for)
makes a full run with a one-line reason. Otherwise a test is selected when a block,
file or library it used changed, a changed file matches its depends_on globs, it did not
pass in the baseline (failed, skipped: no evidence), it has no recorded dependencies,
its device count changed, or it is new.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from devpool.select.baseline import (
    BaselineProblem,
    Bucket,
    changed_since,
    check_generation,
    compatibility_inputs,
    git,
    git_ignored,
    identity_key,
    library_path,
)
from devpool.select.fingerprints import BlockCache, file_hash, library_stamp
from devpool.select.options import SelectOptions, matches
from devpool.version import __version__
from devpool.wording import counted


@dataclass
class Selection:
    """The answer: a full run with its reason, or the tests to run and why each was kept."""

    full_reason: str | None = None
    selected: dict[str, str] = field(default_factory=dict)  # node id → what selected it
    deselected: dict[str, str] = field(default_factory=dict)  # node id → why it is safe
    generation: str | None = None
    age_s: float | None = None
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line for the terminal: the full run's reason, or how many tests run and why."""
        if self.full_reason is not None:
            return f"full run: {self.full_reason}"
        total = len(self.selected) + len(self.deselected)
        age = f", {self.age_s / 3600:.1f} h old" if self.age_s is not None else ""
        line = f"{len(self.selected)} of {total} tests selected (baseline {self.generation}{age})"
        return f"{line}: {self.reasons()}" if self.selected else line

    def reasons(self) -> str:
        """How many tests each kind of reason selected, the most first: "3 new, 2 failed in
        the baseline, 1 by tests/test_x.py"."""
        kinds = Counter(reason_kind(why) for why in self.selected.values())
        return ", ".join(f"{count} {kind}" for kind, count in kinds.most_common())

    def as_event(self) -> dict[str, Any]:
        """The fields of the run record's select event."""
        total = len(self.selected) + len(self.deselected)
        return {
            "full_run": self.full_reason is not None,
            "reason": self.full_reason or "",
            "selected": len(self.selected),
            "total": total,
            "ratio": round(len(self.selected) / total, 4) if total else 1.0,
            "generation": self.generation,
            "baseline_age_s": round(self.age_s, 1) if self.age_s is not None else None,
            "why": dict(sorted(self.selected.items())),  # node id → what selected it
        }


@dataclass(frozen=True)
class Current:
    """What the run about to start looks like."""

    root: Path
    bucket: Bucket
    options: SelectOptions
    identity: Mapping[str, Any]
    rev: str = "HEAD"
    platform: str | None = None  # None: not known (the devpool select command)
    inifile: str | None = None
    devices: Mapping[str, int] | None = None  # node id → device count of the collected tests
    pool: int | None = None  # the devices this runner has (a database store's identity key)
    pin: str | None = None  # a queue run: its jobs select from the generation its first chose


class BaselineStore(Protocol):
    """Where generations are found: a project's folder (baseline.Store) or a fleet's
    PostgreSQL (store_pg.PgStore)."""

    def newest(
        self, bucket_id: str, key: str, pin: str | None = None
    ) -> tuple[str, bytes, bytes] | None: ...

    def write(self, manifest: dict[str, Any], database: Mapping[str, Any]) -> Path | str | None: ...


def select(store: BaselineStore, current: Current, now: float | None = None) -> Selection:
    """Validate the bucket's newest baseline and classify the change; never raises for it."""
    key = identity_key(current.bucket.id, current.platform, current.pool, current.identity)
    try:
        found = store.newest(current.bucket.id, key, current.pin)
    except BaselineProblem as exc:
        return Selection(full_reason=str(exc))
    if found is None:
        why_none = getattr(store, "why_none", None)  # a fleet's: a class its run did not cover
        why = why_none(current.bucket.id, current.platform) if why_none else None
        if why:
            return Selection(full_reason=f"no baseline for platform {current.platform}: {why}")
        return Selection(
            full_reason="no baseline for this bucket (record one with --devpool-select record)"
        )
    name = found[0]
    try:
        manifest, database = check_generation(found[1], found[2], f"baseline {name}")
        age = (time.time() if now is None else now) - float(manifest.get("created", 0))
        _validate(manifest, current, age)
        selection = _classify(manifest, database, current)
    except BaselineProblem as exc:
        return Selection(full_reason=str(exc), generation=name)
    selection.generation, selection.age_s = manifest["generation"], age
    return selection


def _validate(manifest: Mapping[str, Any], current: Current, age: float) -> None:
    name = f"baseline {manifest.get('generation')}"
    if manifest.get("devpool") != __version__:
        raise BaselineProblem(
            f"{name} was recorded by devpool {manifest.get('devpool')}, this is {__version__}"
        )
    if manifest.get("bucket", {}).get("id") != current.bucket.id:
        raise BaselineProblem(f"{name} belongs to another bucket")
    if current.platform is not None and manifest.get("platform") != current.platform:
        raise BaselineProblem(
            f"{name} was recorded on platform {manifest.get('platform')}, "
            f"this run is on {current.platform}"
        )
    recorded = manifest.get("identity", {})
    for key in sorted(set(recorded) | set(current.identity)):
        old, new = recorded.get(key), current.identity.get(key)
        if key == "packages" and isinstance(old, dict) and isinstance(new, dict):
            for package in sorted(set(old) | set(new)):
                if old.get(package, "-") != new.get(package, "-"):
                    raise BaselineProblem(
                        f"runtime identity changed: {package} {old.get(package)} → "
                        f"{new.get(package)}"
                    )
        elif old != new:
            raise BaselineProblem(f"runtime identity changed: {key} {old} → {new}")
    limit = current.options.max_age_days * 86400
    if age > limit:
        raise BaselineProblem(
            f"{name} is {age / 86400:.1f} days old (max-age-days {current.options.max_age_days:g})"
        )
    if current.inifile is not None and manifest.get("inifile") != current.inifile:
        raise BaselineProblem(
            f"the configuration file is {current.inifile}, the baseline's was "
            f"{manifest.get('inifile')}"
        )
    commit = manifest.get("commit")
    if not commit:
        raise BaselineProblem(f"{name} has no source commit (recorded outside git)")
    answer = git(current.root, "merge-base", "--is-ancestor", commit, current.rev)
    if answer.returncode == 1:
        raise BaselineProblem(f"{name}'s commit {commit[:12]} is not an ancestor of {current.rev}")
    if answer.returncode != 0:
        raise BaselineProblem(
            f"{name}'s commit {commit[:12]} or {current.rev} is unknown to this repository"
        )
    inputs = compatibility_inputs(
        current.root, current.bucket, current.options, manifest.get("inifile")
    )
    before = manifest.get("compat", {})
    for rel in sorted(set(before) | set(inputs)):
        if before.get(rel, "-") != inputs.get(rel, "-"):
            what = "added" if rel not in before else "removed" if rel not in inputs else "changed"
            raise BaselineProblem(f"compatibility input {what}: {rel}")


def _classify(
    manifest: Mapping[str, Any], database: Mapping[str, Any], current: Current
) -> Selection:
    root, options = current.root, current.options
    listed = git(root, "ls-files")
    tracked = set(listed.stdout.split("\n")) if listed.returncode == 0 else set()
    # A baseline of an older devpool listed untracked files (its run folder, scratch) as
    # dirty: only what git tracks now, or what a test read, counts.
    dirty = {rel for rel in manifest.get("dirty", []) if rel in tracked}
    changed = set(changed_since(root, manifest["commit"])) | dirty
    blocks, files, libs = database["blocks"], database["files"], database["libs"]

    # An untracked file a test read is checked every time, unless git ignores it (a cache,
    # a build output): what git ignores is no input of a selective run.
    ignored = git_ignored(root, {rel for rel, _ in files if rel not in tracked})

    def may_differ(rel: str) -> bool:
        return rel not in ignored and (rel in changed or rel not in tracked)

    cache = BlockCache(root)
    changed_blocks: set[int] = set()
    for index, (key, digest) in enumerate(blocks):
        rel = key.split("::", 1)[0]
        if may_differ(rel):
            module = cache.blocks(rel)
            if module is None or module.hashes.get(key) != digest:
                changed_blocks.add(index)
    changed_files = {
        i
        for i, (rel, digest) in enumerate(files)
        if may_differ(rel) and file_hash(root / rel) != digest
    }
    changed_libs = set()
    for index, (name, size, mtime, digest) in enumerate(libs):
        path = library_path(root, name)  # one inside the checkout: under this rootdir
        stamp = library_stamp(path)
        if stamp == (size, mtime):
            continue
        if stamp is None or digest is None or file_hash(Path(path)) != digest:
            changed_libs.add(index)
    globs = {g for test in database["tests"].values() for g in test.get("globs", [])}
    known = {key.split("::", 1)[0] for key, _ in blocks} | {rel for rel, _ in files}
    selection = Selection()
    loose: list[str] = []  # untracked files no test read: not inputs
    unignored: list[str] = []  # what any change selects (an unseen test) counts
    for rel in sorted(changed):
        if options.ignored(rel):
            selection.notes.append(f"{rel}: ignored ([tool.devpool.select] ignore)")
            continue
        unignored.append(rel)
        if rel.endswith(".py") and rel not in known:
            selection.notes.append(f"{rel}: no recorded test loaded it")
        elif not _accounted(rel, known, manifest, globs, {path for path, *_ in libs}, root):
            if rel not in tracked:
                loose.append(rel)
                continue
            raise BaselineProblem(
                f"{rel} changed and nothing accounts for it (no test read it, no depends_on or "
                "[tool.devpool.select] inputs glob names it; list it under ignore if it "
                "cannot affect tests)"
            )
    if ignored:
        selection.notes.append(
            f"git ignores {counted(len(ignored), 'file')} tests read (not inputs), "
            f"e.g. {min(ignored)}"
        )
    if loose:
        selection.notes.append(
            f"{len(loose)} untracked file{'s' if len(loose) != 1 else ''} no recorded test "
            f"read (not inputs; git add one to make it count), e.g. {loose[0]}"
        )
    changed_paths = sorted(changed)
    for nodeid, test in database["tests"].items():
        if current.devices is not None and nodeid not in current.devices:
            continue  # not collected in this run (removed, or not in -k/-m any more)
        why = _why_selected(
            test,
            nodeid,
            current,
            blocks,
            files,
            libs,
            changed_blocks,
            changed_files,
            changed_libs,
            changed_paths,
            unignored,
        )
        if why:
            selection.selected[nodeid] = why
        else:
            selection.deselected[nodeid] = (
                f"its {len(test['blocks'])} code blocks, {len(test['files'])} files and "
                f"{len(test['libs'])} libraries are unchanged"
            )
    for nodeid in current.devices or {}:
        if nodeid not in database["tests"]:
            selection.selected[nodeid] = "new: not in the baseline"
    return selection


def reason_kind(why: str) -> str:
    """What a test's selection reason (_why_selected) comes down to, for a count: the file
    that changed, or the kind of reason ("new", "skipped in the baseline")."""
    for prefix in ("code block ", "file ", "library "):
        if why.startswith(prefix) and why.endswith(" changed"):
            return f"by {why[len(prefix) : -len(' changed')].split('::', 1)[0]}"
    if why.endswith(" matches its depends_on globs"):
        return f"by {why.split(' ', 1)[0]} (depends_on)"
    if why.startswith("device count"):
        return "device count changed"
    return why.split(":", 1)[0].split(" (", 1)[0]


def _accounted(
    rel: str,
    known: set[str],
    manifest: Mapping[str, Any],
    globs: set[str],
    libraries: set[str],
    root: Path,
) -> bool:
    """Whether a changed file is one that fingerprints, globs or compatibility inputs cover."""
    if rel in known or rel in manifest.get("compat", {}):
        return True
    return matches(rel, sorted(globs)) or rel in libraries or str(root / rel) in libraries


def _why_selected(
    test: Mapping[str, Any],
    nodeid: str,
    current: Current,
    blocks: list[list[Any]],
    files: list[list[Any]],
    libs: list[list[Any]],
    changed_blocks: Collection[int],
    changed_files: Collection[int],
    changed_libs: Collection[int],
    changed_paths: list[str],
    unignored: list[str],
) -> str:
    if not test["recorded"]:
        return f"no recorded dependencies ({test.get('why') or 'not recorded'})"
    if test["outcome"] != "passed":
        return f"{test['outcome']} in the baseline"
    if current.devices is not None and current.devices.get(nodeid) != test["devices"]:
        return f"device count {test['devices']} → {current.devices.get(nodeid)}"
    for index in test["blocks"]:
        if index in changed_blocks:
            return f"code block {blocks[index][0]} changed"
    for index in test["files"]:
        if index in changed_files:
            return f"file {files[index][0]} changed"
    for index in test["libs"]:
        if index in changed_libs:
            return f"library {libs[index][0]} changed"
    for rel in changed_paths:
        if matches(rel, test.get("globs", [])):
            return f"{rel} matches its depends_on globs"
    if test.get("unseen") and unignored:  # a process it started did not tell what it ran
        return f"any change selects it ({unignored[0]} changed; {test['unseen']})"
    return ""
