"""Screenshots for the docs (docs/img/), taken by the tests that drive a browser.

A browser test checks what its page shows, then hands its screenshot here; with
DEVPOOL_DOCS_SCREENSHOTS=FOLDER set, the picture is kept there under the docs' name.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

FOLDER_VARIABLE = "DEVPOOL_DOCS_SCREENSHOTS"


def keep_for_docs(shot: Path, name: str) -> Path | None:
    """Copy a checked screenshot to FOLDER/name when the variable names a folder."""
    folder = os.environ.get(FOLDER_VARIABLE)
    if not folder:
        return None
    target = Path(folder) / name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, target)
    return target
