"""A template's preload (worker/template.py): modules imported first, a failure skipped,
a warning or a thread told."""

from __future__ import annotations

import sys
from pathlib import Path

from devpool.worker import template


def test_preload_skips_failures_and_tells_warnings_and_threads(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "warnsmod.py").write_text(
        "import warnings\nwarnings.warn('old', DeprecationWarning)\n"
    )
    (tmp_path / "plainmod.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("warnsmod", "plainmod"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    done = template.preload(["no_such_module_here", "warnsmod", "plainmod", "json"])
    assert done.count == 2 and done.warned == ["warnsmod"] and done.threaded == []
    assert "plainmod" in sys.modules
