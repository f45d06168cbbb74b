"""Unit tests of selective runs: block fingerprints, options, baseline generations, validation."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
import textwrap
from pathlib import Path

import pytest

from devpool import __version__
from devpool.config import select_mode
from devpool.errors import DevpoolError
from devpool.select.archive import import_archive
from devpool.select.baseline import (
    SCHEMA,
    BaselineProblem,
    Bucket,
    Builder,
    Store,
    bucket_of,
    compatibility_inputs,
    export_generation,
    load_generation,
    toolkits,
    union_deps,
)
from devpool.select.diff import Current, select
from devpool.select.fingerprints import blocks_of_source
from devpool.select.options import SelectOptions, matches, select_options
from devpool.select.policy import auto_mode

SOURCE = textwrap.dedent(
    """
    import os

    LIMIT = 3


    def outer(x):
        def inner(y):
            return y + 1  # a comment

        return inner(x) * 2


    class Model:
        @staticmethod
        def forward(x):
            return x - LIMIT
    """
)


def changed_blocks(before: str, after: str) -> set[str]:
    old, new = blocks_of_source("m.py", before).hashes, blocks_of_source("m.py", after).hashes
    return {key for key in old.keys() | new.keys() if old.get(key) != new.get(key)}


def test_an_edit_inside_one_body_changes_that_block_alone() -> None:
    assert changed_blocks(SOURCE, SOURCE.replace("y + 1", "y + 2")) == {
        "m.py::outer.<locals>.inner"
    }
    assert changed_blocks(SOURCE, SOURCE.replace("x - LIMIT", "x + LIMIT")) == {
        "m.py::Model.forward"
    }
    assert changed_blocks(SOURCE, SOURCE.replace("* 2", "* 3")) == {"m.py::outer"}


def test_comments_and_moved_lines_change_nothing_but_signatures_change_the_top_level() -> None:
    assert changed_blocks(SOURCE, SOURCE.replace("# a comment", "# edited")) == set()
    assert changed_blocks(SOURCE, "\n\n" + SOURCE) == set()
    assert changed_blocks(SOURCE, SOURCE.replace("LIMIT = 3", "LIMIT = 4")) == {"m.py::<module>"}
    # A signature is in both: the definition runs at import, the defaults shape each call.
    assert changed_blocks(SOURCE, SOURCE.replace("def outer(x)", "def outer(x=1)")) == {
        "m.py::<module>",
        "m.py::outer",
    }


def test_a_line_belongs_to_the_innermost_function_around_it() -> None:
    blocks = blocks_of_source("m.py", SOURCE)
    lines = SOURCE.splitlines()
    assert blocks.block_at(lines.index("LIMIT = 3") + 1) == "m.py::<module>"
    assert blocks.block_at(lines.index("        return y + 1  # a comment") + 1) == (
        "m.py::outer.<locals>.inner"
    )
    assert blocks.block_at(lines.index("    @staticmethod") + 1) == "m.py::Model.forward"
    assert blocks_of_source("bad.py", "def (").hashes.keys() == {"bad.py::<module>"}


def test_options_table_and_globs() -> None:
    assert select_mode("shadow") == "shadow" and select_mode({"mode": "on"}) == "on"
    with pytest.raises(ValueError):
        select_mode("sometimes")
    options = select_options({"select": {"inputs": ["Dockerfile"], "max-age-days": 2}}, "p")
    assert options.inputs == ("Dockerfile",) and options.max_age_days == 2
    with pytest.raises(DevpoolError, match="unknown key 'full_on'"):
        select_options({"select": {"full_on": []}}, "pyproject.toml")
    with pytest.raises(DevpoolError, match="key-packages must be a list of strings"):
        select_options({"select": {"key-packages": "torch"}}, "pyproject.toml")
    assert select_options({"select": {"keep": 2}}, "p").keep == 2
    for bad in (0, -1, "3", True, 2.5):
        with pytest.raises(DevpoolError, match=r"^p: \[tool.devpool.select\] keep must be a whole"):
            select_options({"select": {"keep": bad}}, "p")
    assert matches("docs/a/b.md", ("*.md",)) and matches("kernels/x.cu", ("kernels/*.cu",))
    assert not matches("src/x.cu", ("kernels/*.cu",))


def test_buckets_are_paths_relative_to_the_rootdir(tmp_path: Path) -> None:
    sub = tmp_path / "tests"
    sub.mkdir()
    here = bucket_of(tmp_path, sub, ["test_a.py::test_x", "."], "gpu", "")
    there = bucket_of(tmp_path, tmp_path, ["tests", "tests/test_a.py::test_x"], "gpu", "")
    assert here == there and here.paths == ("tests", "tests/test_a.py::test_x")
    assert here.id != bucket_of(tmp_path, tmp_path, ["tests"], "", "").id


def deps(nodeid: str, block_hash: str = "h1") -> dict[str, object]:
    return {
        "nodeid": nodeid,
        "recorded": True,
        "why": "",
        "blocks": {"m.py::f": block_hash},
        "files": {},
        "libs": {},
        "globs": [],
    }


def test_attempts_of_one_test_merge_worst_outcome_and_conflicting_fingerprints(
    tmp_path: Path,
) -> None:
    builder = Builder(tmp_path)
    builder.add(deps("t::a"), "failed", 0)
    builder.add(deps("t::a", "h2"), "passed", 0)
    database = builder.database({})
    assert database["tests"]["t::a"]["outcome"] == "failed"
    assert database["blocks"] == [["m.py::f", "conflict"]]


def test_a_library_stamped_twice_keeps_one_stamp_and_the_database_its_shape(
    tmp_path: Path,
) -> None:
    # Two attempts (or two ranks on two nodes) saw the same library with other stamps.
    builder = Builder(tmp_path)
    builder.add({**deps("t::a"), "libs": {"/usr/lib/libx.so": [10, 1]}}, "passed", 0)
    builder.add({**deps("t::a"), "libs": {"/usr/lib/libx.so": [10, 2]}}, "passed", 0)
    database = builder.database({"/usr/lib/libx.so": "hx"})
    assert database["libs"] == [["/usr/lib/libx.so", 10, 1, "hx"]]


def test_a_library_inside_the_project_is_resolved_and_stamped_on_the_controller(
    tmp_path: Path,
) -> None:
    # A Ray worker with shipped code names a project library relative to its own rootdir.
    (tmp_path / "native").mkdir()
    library = tmp_path / "native" / "libk.so"
    library.write_bytes(b"\x7fELF")
    builder = Builder(tmp_path)
    builder.add({**deps("t::a"), "libs": {"native/libk.so": [4, 123]}}, "passed", 0)
    builder.add({**deps("t::b"), "libs": {"/usr/lib/libx.so": [10, 1]}}, "passed", 0)
    stat = library.stat()
    assert builder.tests["t::a"]["libs"] == {str(library): (stat.st_size, stat.st_mtime_ns)}
    assert builder.tests["t::b"]["libs"] == {"/usr/lib/libx.so": [10, 1]}
    assert builder.library_paths() == {str(library), "/usr/lib/libx.so"}


def test_the_ranks_of_a_multi_node_test_give_the_union_of_what_each_ran() -> None:
    rank0 = {**deps("t::a"), "globs": ["k/*.cu"], "files": {"d.txt": "f1"}}
    rank1 = {**deps("t::a"), "blocks": {"m.py::f": "h1", "m.py::g": "h3"}, "globs": ["x/*"]}
    merged = union_deps([rank0, rank1])
    assert merged["blocks"] == {"m.py::f": "h1", "m.py::g": "h3"}
    assert merged["files"] == {"d.txt": "f1"} and merged["globs"] == ["k/*.cu", "x/*"]
    assert rank0["blocks"] == {"m.py::f": "h1"}  # the inputs are left as they were
    unrecorded = {"nodeid": "t::a", "recorded": False, "why": "something replaced it"}
    merged = union_deps([rank0, unrecorded])
    assert merged["recorded"] is False and merged["why"] == "something replaced it"


def manifest(bucket: Bucket, **identity: object) -> dict[str, object]:
    return {
        "schema": SCHEMA,
        "devpool": __version__,
        "platform": "sim",
        "bucket": bucket.as_dict(),
        "identity": {"python": "cpython 3.11.7", "packages": {"torch": "2.1.0"}, **identity},
        "compat": {},
        "commit": None,
        "dirty": [],
    }


def test_generations_are_whole_or_refused(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    bucket = Bucket(("tests",))
    builder = Builder(tmp_path)
    builder.add(deps("t::a"), "passed", 1)
    first = store.write(manifest(bucket), builder.database({}))
    second = store.write(manifest(bucket), builder.database({}))
    assert store.latest(bucket.id) == second and first.name < second.name
    loaded, database = load_generation(second)
    assert loaded["generation"] == second.name and "t::a" in database["tests"]
    archive = tmp_path / "g.tar.gz"
    export_generation(second, archive)
    other = Store(tmp_path / "elsewhere")
    assert [g.name for g in import_archive(other, archive)] == [second.name]
    (second / "deps.json").write_text("{}")
    with pytest.raises(BaselineProblem, match="damaged \\(checksum mismatch\\)"):
        load_generation(second)
    (first / "manifest.json").write_text(json.dumps({"schema": 99}))
    with pytest.raises(BaselineProblem, match="schema 99 is not devpool's baseline schema"):
        load_generation(first)
    foreign = tmp_path / "foreign.tar.gz"
    with tarfile.open(foreign, "w:gz") as tar:
        info = tarfile.TarInfo("x/notes.txt")
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(BaselineProblem, match="holds no manifest.json"):
        import_archive(other, foreign)


def test_a_changed_key_package_version_or_a_missing_baseline_means_a_full_run(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "store")
    bucket = Bucket(("tests",))
    current = Current(
        root=tmp_path,
        bucket=bucket,
        options=SelectOptions(),
        identity={"python": "cpython 3.11.7", "packages": {"torch": "2.1.1"}},
        platform="sim",
    )
    assert select(store, current).full_reason == (
        "no baseline for this bucket (record one with --devpool-select record)"
    )
    builder = Builder(tmp_path)
    builder.add(deps("t::a"), "passed", 1)
    store.write(manifest(bucket), builder.database({}))
    assert select(store, current).full_reason == "runtime identity changed: torch 2.1.0 → 2.1.1"
    same = Current(
        root=tmp_path,
        bucket=bucket,
        options=SelectOptions(),
        identity={"python": "cpython 3.11.7", "packages": {"torch": "2.1.0"}},
        platform="cuda",
    )
    reason = select(store, same).full_reason or ""
    assert reason.endswith("was recorded on platform sim, this run is on cuda")


def test_compatibility_inputs_are_the_buckets_conftests_the_inifile_and_the_input_globs(
    tmp_path: Path,
) -> None:
    for name in (
        "conftest.py",
        "tests/conftest.py",
        "tests/unit/conftest.py",
        "tests/unit/test_a.py",
        "tuning/conftest.py",
        "recipes/gpt.yaml",
        "Dockerfile",
        "pyproject.toml",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    options = SelectOptions(inputs=("Dockerfile", "recipes/*.yaml"))
    folder = compatibility_inputs(tmp_path, Bucket(("tests",)), options, "pyproject.toml")
    assert set(folder) == {
        "conftest.py",
        "tests/conftest.py",
        "tests/unit/conftest.py",  # below a folder bucket
        "pyproject.toml",
        "Dockerfile",
        "recipes/gpt.yaml",
    }
    # An explicit file: its ancestors' conftests only; another folder's never.
    single = compatibility_inputs(tmp_path, Bucket(("tests/test_x.py",)), SelectOptions(), None)
    assert set(single) == {"conftest.py", "tests/conftest.py"}


@pytest.mark.parametrize(
    ("environ", "mode"),
    [
        (
            {"GITHUB_ACTIONS": "true", "GITHUB_EVENT_NAME": "push", "GITHUB_REF_NAME": "main"},
            "record",
        ),
        ({"GITHUB_ACTIONS": "true", "GITHUB_EVENT_NAME": "schedule"}, "record"),
        ({"GITHUB_ACTIONS": "true", "GITHUB_EVENT_NAME": "merge_group"}, "record"),
        (
            {
                "GITHUB_ACTIONS": "true",
                "GITHUB_EVENT_NAME": "pull_request",
                "GITHUB_REF_NAME": "12/merge",
                "GITHUB_HEAD_REF": "fix-kernel",
            },
            "on",
        ),
        ({"GITLAB_CI": "true", "CI_COMMIT_BRANCH": "master"}, "record"),
        ({"GITLAB_CI": "true", "CI_MERGE_REQUEST_EVENT_TYPE": "merge_train"}, "record"),
        ({"GITLAB_CI": "true", "CI_MERGE_REQUEST_SOURCE_BRANCH_NAME": "wip"}, "on"),
        ({"BUILDKITE": "true", "BUILDKITE_SOURCE": "schedule", "BUILDKITE_BRANCH": "x"}, "record"),
    ],
)
def test_auto_runs_everything_where_full_on_says(
    environ: dict[str, str], mode: str, tmp_path: Path
) -> None:
    chosen, why = auto_mode(SelectOptions().full_on, environ, tmp_path)
    assert chosen == mode, why


def test_auto_outside_ci_reads_the_branch_git_has_checked_out(tmp_path: Path) -> None:
    assert auto_mode(["main"], {}, tmp_path) == (
        "on",
        "auto: selective run (branch unknown is not in full-on)",
    )
    subprocess.run(["git", "init", "-q", "-b", "release"], cwd=tmp_path, check=True)
    assert auto_mode(["release"], {}, tmp_path)[0] == "record"


def test_toolkit_versions_are_part_of_the_identity(tmp_path: Path) -> None:
    cuda = tmp_path / "version.json"
    cuda.write_text('{"cuda": {"version": "12.4.1"}}')
    files = {"cuda": (str(tmp_path / "absent"), str(cuda)), "cann": (str(tmp_path / "no"),)}
    before = toolkits(files)
    assert before["cann"] is None and before["cuda"] is not None
    assert before["cuda"].startswith('{"cuda": {"version": "12.4.1"}}')
    cuda.write_text('{"cuda": {"version": "12.4.2"}}')  # a patch version is another identity
    assert toolkits(files)["cuda"] != before["cuda"]
