"""The project's own `.devpool/` folder: run folders, history, baselines.

Made with a `.gitignore` inside that ignores it whole, as pytest does for `.pytest_cache`:
devpool's files never show in `git status`, and no project has to list them.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

IGNORE = "# Created by devpool automatically.\n*\n"


def devpool_dir(root: Path) -> Path:
    """ROOT/.devpool, made (with its .gitignore) if it is not there yet."""
    folder = root / ".devpool"
    ignore = folder / ".gitignore"
    if not ignore.exists():
        with contextlib.suppress(OSError):  # a read-only checkout: the caller says so itself
            folder.mkdir(parents=True, exist_ok=True)
            ignore.write_text(IGNORE, encoding="utf-8")
    return folder


def made(folder: Path) -> Path:
    """The folder, made with its parents; a `.devpool` folder on the way gets its .gitignore
    (the history and the preload list are written there even when the run folder is not)."""
    for parent in (folder, *folder.parents):
        if parent.name == ".devpool":
            devpool_dir(parent.parent)
            break
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def new_folder(path: Path, mode: int) -> bool:
    """Make the folder (and its parents), itself with exactly ``mode`` whatever the umask;
    False when something was there already (it keeps its mode)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        return False
    os.chmod(path, mode)
    return True


def writable_folder(path: Path, what: str, mode: int = 0o777) -> None:
    """Make the folder a user named for devpool's output (``mode`` less the umask's bits
    if devpool makes it), or say in one sentence why not.

    what: how the user named it, e.g. "--devpool-run-dir"."""
    from devpool.errors import DevpoolError

    try:
        if mode == 0o777:
            path.mkdir(parents=True, exist_ok=True)
        else:
            new_folder(path, mode)
    except OSError as exc:
        raise DevpoolError(f"{what} {path} cannot be made: {exc.strerror}") from None
    if not path.is_dir():
        raise DevpoolError(f"{what} {path} is a file, not a folder")
    probe = path / f".devpool-write-check-{os.getpid()}"
    try:
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise DevpoolError(f"{what} {path} is not writable: {exc.strerror}") from None
