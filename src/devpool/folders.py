"""The project's own `.devpool/` folder: run folders, history, baselines.

Made with a `.gitignore` inside that ignores it whole, as pytest does for `.pytest_cache`:
devpool's files never show in `git status`, and no project has to list them.
"""

from __future__ import annotations

import contextlib
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
