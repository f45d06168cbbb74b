"""The preload file (history/preload.py): what each kind's tests imported, kept beside the
history; a damaged or foreign file preloads nothing; `never` modules stay out."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from devpool.history import preload


def test_lists_are_kept_per_kind_and_never_modules_stay_out(tmp_path: Path) -> None:
    path = preload.preload_path(tmp_path / "history.sqlite")
    assert path.name == "history.preload.json"
    preload.write(path, {0: ["a", "b", "a"], 1: ["c"]})
    assert preload.modules_of(path, 0) == ["a", "b"] and preload.modules_of(path, 1) == ["c"]
    preload.write(path, {1: ["d", "e"]}, never={1: ["e"]})
    assert preload.modules_of(path, 0) == ["a", "b"]  # a kind this run did not run keeps it
    assert preload.modules_of(path, 1) == ["d"]
    preload.write(path, {1: ["e", "f"]})  # learnt again by a later run: still never
    assert preload.modules_of(path, 1) == ["f"]
    preload.write(path, {}, dropped=[0])
    assert preload.modules_of(path, 0) == []


def test_a_damaged_or_foreign_file_preloads_nothing(tmp_path: Path) -> None:
    path = tmp_path / "history.preload.json"
    for text in ["{not json", "[]", json.dumps({"format": "other", "kinds": {"0": ["x"]}})]:
        path.write_text(text)
        assert preload.modules_of(path, 0) == []
    assert preload.modules_of(tmp_path / "missing.json", 0) == []


def test_only_libraries_are_listed_not_the_projects_own_modules(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]  # this checkout: its tests are project code
    names = ["json", __name__, "sys"]  # sys has no file: nothing to import first
    assert __name__ in sys.modules
    assert preload.libraries(names, root) == ["json"]
    assert preload.libraries(names, tmp_path) == ["json", __name__]
