"""What a selective run keeps and why: a test's marks are its own block, what git ignores is
no input, a test its worker sent no dependencies for is in the baseline, and each kept
test's reason is counted on the summary line."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

from devpool import __version__
from devpool.select.baseline import SCHEMA, Bucket, Builder, Store, compatibility_inputs
from devpool.select.diff import Current, Selection, reason_kind, select
from devpool.select.fingerprints import blocks_of_source
from devpool.select.options import SelectOptions

MODULE = textwrap.dedent(
    """
    import functools

    import pytest


    @pytest.mark.parametrize("x", [1, 2])
    def test_a(x):
        assert x


    @pytest.mark.skipif(False, reason="never")
    def test_b():
        assert helper()


    @functools.cache
    def helper():
        return 1


    @pytest.fixture(params=[1])
    def number(request):
        return request.param
    """
)


def changed(after: str) -> set[str]:
    old, new = blocks_of_source("m.py", MODULE).hashes, blocks_of_source("m.py", after).hashes
    return {key for key in old.keys() | new.keys() if old.get(key) != new.get(key)}


def test_a_mark_edit_changes_its_test_s_block_alone() -> None:
    assert changed(MODULE.replace("[1, 2]", "[1, 3]")) == {"m.py::test_a"}
    assert changed(MODULE.replace("skipif(False", "skipif(True")) == {"m.py::test_b"}
    # Any other decorator runs at import, for every test that may use what it builds.
    assert changed(MODULE.replace("functools.cache", "functools.lru_cache")) == {
        "m.py::<module>",
        "m.py::helper",
    }
    assert changed(MODULE.replace("params=[1]", "params=[2]")) == {
        "m.py::<module>",
        "m.py::number",
    }


def git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True)
    return done.stdout.strip()


def test_a_selective_run_says_why_it_keeps_each_test(tmp_path: Path) -> None:
    test_file = tmp_path / "tests" / "test_m.py"
    test_file.parent.mkdir()
    test_file.write_text(MODULE)
    (tmp_path / ".gitignore").write_text("cache/\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "nodeids").write_text("[]")  # ignored: never an input
    (tmp_path / "loose.txt").write_text("1")  # untracked but not ignored: an input

    lines = MODULE.splitlines()
    rel = "tests/test_m.py"
    builder = Builder(tmp_path)
    for name, read in (("test_a", "cache/nodeids"), ("test_b", "loose.txt")):
        line = next(n for n, text in enumerate(lines, 1) if text.startswith(f"def {name}("))
        builder.add(
            {
                "nodeid": f"{rel}::{name}",
                "recorded": True,
                "why": "",
                "spots": [(rel, 0), (rel, line)],  # the module's top level and the test
                "files": {read: "recorded before"},
                "libs": {},
                "globs": [],
            },
            "passed",
            0,
        )
    sent_none = {"nodeid": f"{rel}::test_c", "recorded": False, "why": "its worker sent none"}
    builder.add(sent_none, "passed", 0)
    database = builder.database({})
    assert [row[0] for row in database["files"]] == ["loose.txt"]  # recorded without the cache
    database["files"].append(["cache/nodeids", "recorded before"])  # an older baseline's
    database["tests"][f"{rel}::test_a"]["files"] = [1]

    bucket, options = Bucket(("tests",)), SelectOptions()
    manifest = {
        "schema": SCHEMA,
        "devpool": __version__,
        "platform": "sim",
        "bucket": bucket.as_dict(),
        "identity": {},
        "compat": compatibility_inputs(tmp_path, bucket, options, None),
        "commit": git(tmp_path, "rev-parse", "HEAD"),
        "dirty": [],
    }
    store = Store(tmp_path / ".devpool" / "select")
    store.write(manifest, database)
    test_file.write_text(MODULE.replace("[1, 2]", "[1, 3]"))
    (tmp_path / "cache" / "nodeids").write_text("[1]")
    current = Current(root=tmp_path, bucket=bucket, options=options, identity={})

    selection = select(store, current)

    assert selection.full_reason is None, selection.full_reason
    assert selection.selected == {
        f"{rel}::test_a": f"code block {rel}::test_a changed",
        f"{rel}::test_b": "file loose.txt changed",  # "recorded before": not its hash
        f"{rel}::test_c": "no recorded dependencies (its worker sent none)",
    }
    assert "git ignores 1 file tests read (not inputs), e.g. cache/nodeids" in selection.notes
    assert selection.summary().endswith(
        ": 1 by tests/test_m.py, 1 by loose.txt, 1 no recorded dependencies"
    )
    assert selection.as_event()["why"] == selection.selected


def test_every_reason_comes_down_to_a_file_or_a_kind() -> None:
    reasons = {
        "new: not in the baseline": "new",
        "skipped in the baseline": "skipped in the baseline",
        "device count 1 → 2": "device count changed",
        "code block lib.py::mul changed": "by lib.py",
        "file data/x.txt changed": "by data/x.txt",
        "library libfoo.so changed": "by libfoo.so",
        "src/a.py matches its depends_on globs": "by src/a.py (depends_on)",
        "no recorded dependencies (a doctest: its examples are text)": "no recorded dependencies",
    }
    assert {why: reason_kind(why) for why in reasons} == reasons
    assert Selection(selected={"a": "new: x", "b": "new: y"}).reasons() == "2 new"
