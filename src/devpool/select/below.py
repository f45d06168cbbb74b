"""Whether this process runs below a worker of a recording run, and that worker's folder.

Asked at every `import devpool` (and by devpool-children.pth as any Python of the
environment starts), so it imports nothing but os, stat and devpool.procfs, and answers at
once where no recording run ever ran on this host: children.py, which watches, is imported
only when a folder is found. A worker's folder is `BASE/<pid>`, with its rootdir in `root`
and its start time in `started` (children.make_folder).
"""

from __future__ import annotations

import os
import stat

from devpool import procfs

FOLDER = "DEVPOOL_RECORD_CHILDREN"
BASE = f"/tmp/devpool-children-{os.getuid()}"
_DEPTH = 64  # ancestors walked, at most


def is_live(folder: str) -> bool:
    """Whether the folder's process still runs, the one that made it (not a reused pid)."""
    try:
        with open(os.path.join(folder, "started")) as file:
            made_by = file.read()
    except OSError:
        return False
    return str(procfs.started(os.path.basename(folder))) == made_by


def own_base(base: str = BASE) -> bool:
    """Whether the base is a folder of this user's that nobody else may write (not a link)."""
    try:
        info = os.lstat(base)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


def _ancestors_folder() -> str | None:
    """The folder of the recording worker among this process's ancestors, if any."""
    if not own_base():
        return None
    pid = os.getppid()
    for _ in range(_DEPTH):
        if pid <= 1:
            return None
        folder = os.path.join(BASE, str(pid))
        if os.path.isdir(folder):
            return folder
        fields = procfs.fields(pid)
        if len(fields) < 2 or not fields[1].isdigit():
            return None
        pid = int(fields[1])
    return None


def find() -> str | None:
    """The folder of the live recording worker this process runs below: named in FOLDER, or
    found among its ancestors (a test gave it an environment of its own); else None."""
    named = os.environ.get(FOLDER)
    if not named and not os.path.isdir(BASE):
        return None  # no recording run on this host: the common case, one stat
    folder = named or _ancestors_folder()
    return folder if folder and is_live(folder) else None
