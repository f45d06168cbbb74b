"""End to end: selective runs (--devpool-select) under the Ray backend, on a real two-node
Ray cluster on loopback (the `cluster` fixture), with the code on the shared filesystem or
shipped to the nodes (--devpool-ray-ship-code: the workers run a copy elsewhere).

A baseline recorded under Ray must hold what a local one holds, paths relative to the
controller's rootdir, so that either kind of run can select from the other's baseline.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from ray_cluster import PYPROJECT, Cluster
from select_project import (
    DATA,
    MATH,
    PROJECT,
    Run,
    build_library,
    git,
    git_project,
    native_project,
    record,
    write,
)

pytestmark = pytest.mark.usefixtures("selective_env")

RAY_TIMEOUT = 240  # seconds a session on the cluster may take (2 shared cores)
SHIP = "--devpool-ray-ship-code"
WHERE = {
    # Where the test's worker ran: a copy of the project when the code is shipped.
    "tests/test_where.py": """
        import os
        from pathlib import Path


        def test_where():
            out = os.environ.get("WHERE_OUT")
            if out:
                Path(out).write_text(__file__)
        """,
}
# test_eight fits neither 4 devices nor a 4-NPU node: skipped unrun, it is in no baseline.
# test_eight needs more devices than the pool has: it never runs, and is in the baseline as
# a test without recorded dependencies (selected by every selective run, saying why).
NEVER_RAN = "tests/test_data.py::test_eight"
RECORDED = {*MATH, *DATA, "tests/test_where.py::test_where"} - {NEVER_RAN}


def ray_project(root: Path, files: dict[str, str]) -> Path:
    """The files with the sim platform counted in the cluster's NPU, committed."""
    pyproject = textwrap.dedent(files["pyproject.toml"]).lstrip("\n") + PYPROJECT
    return git_project(root, {**files, "pyproject.toml": pyproject})


def on_ray(cluster: Cluster, *more: str) -> tuple[str, ...]:
    return ("--devpool-backend=ray", f"--devpool-ray-address={cluster.address}", *more)


def ray_run(pytester: pytest.Pytester, tmp: Path, name: str, cluster: Cluster, *args: str) -> Run:
    """A session on the cluster (all of the sim platform's devices it has)."""
    return Run(
        pytester, tmp, name, *on_ray(cluster), "--devices", "sim", *args, timeout=RAY_TIMEOUT
    )


def ray_record(
    pytester: pytest.Pytester, tmp: Path, name: str, cluster: Cluster, *more: str
) -> Run:
    run = record(pytester, tmp, "sim", name=name, more=on_ray(cluster, *more), timeout=RAY_TIMEOUT)
    # Every test that ran did so in a Ray actor: its job_end names the rank's node.
    ran = [e for e in run.events if e["type"] == "job_end" and e["outcome"] != "skipped"]
    assert ran and all(e["ranks"] and e["ranks"][0]["node_id"] for e in ran), ran
    return run


def baseline(root: Path) -> dict[str, dict[str, Any]]:
    """The newest baseline's tests, their fingerprints resolved: blocks and files as
    {key: hash}, libraries as {path: content hash}."""
    found = sorted((root / ".devpool" / "select").glob("*/*/deps.json"))
    newest = max(found, key=lambda path: path.parent.name)
    database = json.loads(newest.read_text())
    tests: dict[str, dict[str, Any]] = {}
    for nodeid, test in database["tests"].items():
        entry = {key: test[key] for key in ("outcome", "devices", "recorded")}
        if test["recorded"]:
            entry["blocks"] = dict(database["blocks"][i] for i in test["blocks"])
            entry["files"] = dict(database["files"][i] for i in test["files"])
            entry["libs"] = {database["libs"][i][0]: database["libs"][i][3] for i in test["libs"]}
            entry["globs"] = test["globs"]
        tests[nodeid] = entry
    return tests


@pytest.mark.parametrize("ship", [False, True], ids=["shared-filesystem", "shipped-code"])
def test_a_record_under_ray_writes_the_baseline_a_local_record_writes(
    pytester: pytest.Pytester,
    cluster: Cluster,
    tmp_path: Path,
    ship: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = ray_project(pytester.path, {**PROJECT, **WHERE})
    # Fresh interpreters on both sides: a worker forked from a fork server's template also
    # maps the libraries the template loaded while it collected (more libraries: selection
    # stays sound, it selects more), and the local and the nodes' templates load differently.
    fresh = "--devpool-no-fork-server"
    record(pytester, tmp_path, "sim:0-3", name="local", more=(fresh,))
    local = baseline(root)
    where = tmp_path / "where"
    monkeypatch.setenv("WHERE_OUT", str(where))
    ray_record(pytester, tmp_path, "ray", cluster, fresh, *([SHIP] if ship else []))
    if ship:  # the worker ran a copy of the project, not the controller's files
        assert not Path(where.read_text()).is_relative_to(root), where.read_text()
    else:
        assert Path(where.read_text()) == root / "tests" / "test_where.py"
    on_cluster = baseline(root)
    assert set(local) == set(on_cluster) == {*RECORDED, NEVER_RAN}
    assert local[NEVER_RAN].get("recorded") is False is on_cluster[NEVER_RAN].get("recorded")
    local = {nodeid: test for nodeid, test in local.items() if nodeid != NEVER_RAN}
    for nodeid, test in local.items():
        other = on_cluster[nodeid]
        # The libraries too: the same paths (none in the shipped copy), the same contents.
        for key in ("outcome", "devices", "recorded", "blocks", "files", "globs", "libs"):
            assert other.get(key) == test.get(key), (nodeid, key)
    # What they hold: code blocks of project functions, data files read, depends_on globs.
    mul = on_cluster["tests/test_math.py::test_mul"]
    assert "lib.py::mul" in mul["blocks"] and "lib.py::add" not in mul["blocks"]
    config = on_cluster["tests/test_data.py::test_reads_config"]
    assert set(config["files"]) == {"configs/model.yaml"}
    kernels = on_cluster["tests/test_data.py::test_kernels"]
    assert kernels["globs"] == ["kernels/*.cu"] and set(kernels["files"]) == {"kernels/a.cu"}


def test_an_edit_under_ray_selects_the_tests_that_ran_it_there_and_locally(
    pytester: pytest.Pytester, cluster: Cluster, tmp_path: Path
) -> None:
    root = ray_project(pytester.path, PROJECT)
    ray_record(pytester, tmp_path, "record", cluster)
    lib = root / "lib.py"
    lib.write_text(lib.read_text().replace("return a * b", "return b * a"))
    expected = {"tests/test_math.py::test_mul", "tests/test_math.py::test_both"}
    run = ray_run(pytester, tmp_path, "on", cluster, "--devpool-select", "on")
    assert run.result.ret == 0, run.output()
    # test_eight fits no node (skipped, as in the baseline: no evidence, so it is kept).
    assert run.ran == expected | {"tests/test_data.py::test_eight"}, run.output()
    assert run.select["full_run"] is False
    assert run.select["selected"] == 3 and run.select["total"] == 7
    run.result.stdout.fnmatch_lines(["*2 passed, 1 skipped, 4 deselected*"])
    # The baseline recorded on the cluster serves a local run the same way.
    local = Run(pytester, tmp_path, "local", "--devices", "sim:0-3", "--devpool-select", "on")
    assert local.result.ret == 0, local.output()
    assert local.ran == run.ran and local.select["selected"] == 3


def test_a_local_baseline_selects_under_ray_with_shipped_code(
    pytester: pytest.Pytester, cluster: Cluster, tmp_path: Path
) -> None:
    root = ray_project(pytester.path, PROJECT)
    record(pytester, tmp_path, "sim:0-3")
    (root / "configs" / "model.yaml").write_text("depth: 3\n")
    lib = root / "lib.py"
    lib.write_text(lib.read_text().replace("return a + b", "return b + a"))
    run = ray_run(pytester, tmp_path, "on", cluster, SHIP, "--devpool-select", "on")
    assert run.result.ret == 0, run.output()
    expected = {f"tests/test_math.py::test_{n}" for n in ("add", "both")} | {
        "tests/test_data.py::test_reads_config",
        "tests/test_data.py::test_eight",
    }
    assert run.ran == expected, run.output()


def test_shadow_under_ray_lists_the_misses(
    pytester: pytest.Pytester,
    cluster: Cluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ray_project(pytester.path, PROJECT)
    ray_record(pytester, tmp_path, "record", cluster)
    # An environment variable is invisible to recording: the failure it causes is a miss.
    monkeypatch.setenv("BREAK_PLAIN", "1")
    run = ray_run(pytester, tmp_path, "shadow", cluster, "--devpool-select", "shadow")
    assert run.result.ret == 1, run.output()
    assert run.ran == MATH | DATA
    assert run.select["mode"] == "shadow" and run.select["selected"] == 1
    run.result.stdout.fnmatch_lines(
        ["devpool select: MISS tests/test_data.py::test_plain failed but would not have been*"]
    )
    (misses,) = [e for e in run.events if e["type"] == "select_misses"]
    assert misses["misses"] == ["tests/test_data.py::test_plain"]


def test_auto_records_on_the_main_branch_with_shipped_code(
    pytester: pytest.Pytester, cluster: Cluster, tmp_path: Path
) -> None:
    # The nodes' copy has no .git: the workers must not decide `auto` again there.
    root = ray_project(pytester.path, PROJECT)
    git(root, "branch", "-M", "main")
    run = ray_run(pytester, tmp_path, "auto", cluster, SHIP, "--devpool-select", "auto")
    assert run.select["mode"] == "record", run.output()
    assert "devpool select: recorded baseline" in run.output()
    tests = baseline(root)
    assert set(tests) == MATH | DATA
    assert [n for n, t in tests.items() if not t["recorded"]] == [NEVER_RAN], tests


# native/ (not build/, which shipping leaves out) holds the library built from k.c.
NATIVE = native_project("native")


def build(root: Path, value: int) -> None:
    build_library(root, "native", value)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/self/maps")
def test_a_shipped_library_is_fingerprinted_at_the_controllers_path(
    pytester: pytest.Pytester, cluster: Cluster, tmp_path: Path
) -> None:
    root = pytester.path
    write(root, NATIVE)
    build(root, 1)
    ray_project(root, NATIVE)
    # One process per test: a library one test loaded stays mapped in a warm worker.
    isolated = (SHIP, "--devpool-isolation", "job")
    ray_record(pytester, tmp_path, "record", cluster, *isolated)
    # Named relative to the rootdir (a checkout elsewhere selects alike), at the
    # controller's path, not where Ray's node shipped it to.
    library = "native/libk.so"
    native = baseline(root)["tests/test_native.py::test_native"]
    assert library in native["libs"], native["libs"]
    assert library not in baseline(root)["tests/test_native.py::test_python"]["libs"]
    build(root, 1)  # the same source rebuilt: same content, new mtime
    run = ray_run(pytester, tmp_path, "same", cluster, *isolated, "--devpool-select", "on")
    assert run.ran == set(), run.output()
    build(root, 2)
    git(root, "commit", "-qam", "k returns 2")
    run = ray_run(pytester, tmp_path, "rebuilt", cluster, *isolated, "--devpool-select", "on")
    assert run.result.ret == 0, run.output()
    assert run.ran == {"tests/test_native.py::test_native"}, run.output()


RANKS = {
    "pyproject.toml": PROJECT["pyproject.toml"],
    ".gitignore": PROJECT[".gitignore"],
    "work.py": """
        def first():
            return 0


        def second():
            return 1
        """,
    "tests/test_ranks.py": """
        import pytest

        import work


        @pytest.mark.nodes(2)
        @pytest.mark.device_count(1)
        def test_pair(devpool_node):
            # Each rank runs its own part: the test depends on both.
            if devpool_node.rank == 0:
                assert work.first() == 0
            else:
                assert work.second() == 1


        def test_alone():
            assert work.first() == 0
        """,
}


def test_a_multi_node_test_depends_on_what_every_rank_ran(
    pytester: pytest.Pytester, cluster: Cluster, tmp_path: Path
) -> None:
    root = ray_project(pytester.path, RANKS)
    ray_record(pytester, tmp_path, "record", cluster)
    pair = baseline(root)["tests/test_ranks.py::test_pair"]
    assert {"work.py::first", "work.py::second"} <= set(pair["blocks"]), pair["blocks"]
    work = root / "work.py"
    work.write_text(work.read_text().replace("return 1", "return 0 + 1"))
    run = ray_run(pytester, tmp_path, "on", cluster, "--devpool-select", "on")
    assert run.result.ret == 0, run.output()
    assert run.ran == {"tests/test_ranks.py::test_pair"}, run.output()
