"""The archive `devpool select export` writes and `import` reads: one or more generations.

Each generation is a folder of its own in the tar (`<generation>/manifest.json`,
`<generation>/deps.json`); an archive of one generation is what `export_generation`
writes, so archives made before several could travel still import.
"""

from __future__ import annotations

import io
import json
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from devpool.select.baseline import DATABASE, MANIFEST, BaselineProblem, Store

# A generation as it travels: its id, its manifest's bytes, its database's bytes.
Generation = tuple[str, bytes, bytes]


def of_folder(generation: Path) -> Generation:
    """A file store's generation folder, read."""
    return (
        generation.name,
        (generation / MANIFEST).read_bytes(),
        (generation / DATABASE).read_bytes(),
    )


def write_archive(generations: Sequence[Generation], archive: Path) -> None:
    """Write these generations to one tar.gz, each a folder of its own."""
    with tarfile.open(archive, "w:gz") as tar:
        for name, *files in generations:
            for file_name, data in zip((MANIFEST, DATABASE), files, strict=True):
                info = tarfile.TarInfo(f"{name}/{file_name}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def read_archive(archive: Path) -> list[Generation]:
    """Every generation folder of an archive; BaselineProblem when it holds none."""
    folders = _folders(archive)
    found = [
        (name, files[MANIFEST], files[DATABASE])
        for name, files in sorted(folders.items())
        if set(files) == {MANIFEST, DATABASE}
    ]
    if not found:
        raise BaselineProblem(f"{archive} is not a devpool baseline export: it holds no generation")
    return found


def import_archive(store: Store, archive: Path) -> list[Path]:
    """Every generation of the archive into the store, each checked first (BaselineProblem)."""
    folders = _folders(archive)
    if len(folders) <= 1:
        return [store.import_generation(archive)]
    imported = []
    with tempfile.TemporaryDirectory(prefix="devpool-import-") as scratch:
        for name, files in sorted(folders.items()):
            generation = Path(scratch) / name
            generation.mkdir()
            for file_name, data in files.items():
                (generation / file_name).write_bytes(data)
            one = Path(scratch) / f"{name}.tar.gz"
            write_archive([of_folder(generation)], one)
            imported.append(store.import_generation(one))
    return imported


def bucket_words(generation: Path) -> str:
    """A generation's bucket as a user typed it: `tests/gpu -m gpu`; `?` if unreadable."""
    try:
        manifest: Any = json.loads((generation / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "?"
    return manifest_words(manifest)


def manifest_words(manifest: Mapping[str, Any]) -> str:
    """The bucket of a generation's manifest as a user typed it; `?` if it names none."""
    try:
        bucket = manifest["bucket"]
        words = [" ".join(bucket["paths"])]
    except (KeyError, TypeError):
        return "?"
    if bucket.get("markexpr"):
        words.append(f"-m {bucket['markexpr']!r}")
    if bucket.get("keyword"):
        words.append(f"-k {bucket['keyword']!r}")
    return " ".join(words)


def _folders(archive: Path) -> dict[str, dict[str, bytes]]:
    """The archive's generation folders and their two files; {} if it cannot be read (the
    one-generation import then says why)."""
    folders: dict[str, dict[str, bytes]] = {}
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar.getmembers():
                folder, _, name = member.name.rpartition("/")
                handle = tar.extractfile(member) if member.isfile() else None
                if name in (MANIFEST, DATABASE) and handle is not None and _plain(folder):
                    folders.setdefault(folder, {})[name] = handle.read()
    except (OSError, tarfile.TarError):
        return {}
    return folders


def _plain(folder: str) -> bool:
    """A folder name that stays inside the scratch folder."""
    return bool(folder) and "/" not in folder and folder not in (".", "..")
