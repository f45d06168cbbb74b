"""The archive `devpool select export` writes and `import` reads: one or more generations.

Each generation is a folder of its own in the tar (`<generation>/manifest.json`,
`<generation>/deps.json`); an archive of one generation is what `export_generation`
writes, so archives made before several could travel still import.
"""

from __future__ import annotations

import io
import json
import tarfile
import zlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from devpool.select.baseline import DATABASE, MANIFEST, BaselineProblem, Store, plain_name

# A generation as it travels: its id, its manifest's bytes, its database's bytes.
Generation = tuple[str, bytes, bytes]

# What an archive may hold: a generation is two files, its database the big one.
MEMBERS_LIMIT = 10_000
MANIFEST_LIMIT = 1 << 20
DATABASE_LIMIT = 128 << 20
TOTAL_LIMIT = 512 << 20


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
    """Every generation folder of an archive; BaselineProblem, in one sentence, when it is
    damaged, too big or holds none."""
    folders = _folders(archive)
    found = [
        (name, files[MANIFEST], files[DATABASE])
        for name, files in sorted(folders.items())
        if set(files) == {MANIFEST, DATABASE}
    ]
    if not found:
        raise BaselineProblem(
            f"{archive} is not a devpool baseline export: it holds no {MANIFEST} and {DATABASE}"
        )
    return found


def import_archive(store: Store, archive: Path) -> list[Path]:
    """Every generation of the archive into the store, each checked first (BaselineProblem)."""
    return [
        store.place(manifest, database, f"{archive} ({name})" if name else str(archive))
        for name, manifest, database in read_archive(archive)
    ]


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
    """The archive's generation folders and their two files, read within the limits: an
    archive is input from elsewhere, and a small one can unpack to gigabytes."""
    folders: dict[str, dict[str, bytes]] = {}
    total = 0
    try:
        with tarfile.open(archive, "r:*") as tar:
            for count, member in enumerate(_members(tar)):
                if count >= MEMBERS_LIMIT:
                    raise BaselineProblem(
                        f"{archive} holds more than {MEMBERS_LIMIT} files; "
                        "it is not a devpool baseline export"
                    )
                folder, _, name = member.name.rpartition("/")
                if name not in (MANIFEST, DATABASE) or not member.isfile():
                    continue
                limit = MANIFEST_LIMIT if name == MANIFEST else DATABASE_LIMIT
                total += member.size
                if member.size > limit or total > TOTAL_LIMIT:
                    raise BaselineProblem(
                        f"{archive}: {member.name} is too big "
                        f"({member.size} bytes; at most {limit}, {TOTAL_LIMIT} in all)"
                    )
                handle = tar.extractfile(member)
                if handle is not None:
                    folders.setdefault(folder if plain_name(folder) else "", {})[name] = (
                        handle.read(limit + 1)
                    )
    except (OSError, EOFError, zlib.error, tarfile.TarError) as exc:
        why = (str(exc) or type(exc).__name__).splitlines()[0].rstrip(":")
        if isinstance(exc, tarfile.ReadError) and "could not be opened" in why:
            why = "no known compression or tar header"
        raise BaselineProblem(f"{archive} is damaged or not a tar archive: {why}") from None
    return folders


def _members(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """The members one at a time: getmembers() would first keep every header of a huge tar."""
    while (member := tar.next()) is not None:
        yield member
