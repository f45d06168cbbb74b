"""End to end: selective runs (--devpool-select) in a real git repository on sim devices.

Each test writes a small project, commits it, records a baseline with a real pytest
session (workers are processes), changes one thing and checks which tests the next
session runs, from its run record: only those a change can affect, or all of them with
the reason when the baseline cannot be trusted.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
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
from sessions import FAST

pytestmark = pytest.mark.usefixtures("selective_env")


@pytest.fixture
def project(pytester: pytest.Pytester) -> Path:
    return git_project(pytester.path, PROJECT)


def edit_mul_and_select(pytester: pytest.Pytester, project: Path, tmp_path: Path) -> Run:
    """Edit lib.mul after a recording; the `on` run must run exactly the tests that ran it."""
    lib = project / "lib.py"
    lib.write_text(lib.read_text().replace("return a * b", "return b * a"))
    run = Run(pytester, tmp_path, "on", "--devices", "sim:0-1", "--devpool-select", "on")
    assert run.result.ret == 0, run.output()
    # test_eight was never run (unsatisfiable at 2 devices): no evidence, so it is kept.
    expected = {"tests/test_math.py::test_mul", "tests/test_math.py::test_both"}
    assert run.ran == expected | {"tests/test_data.py::test_eight"}
    return run


def test_an_edit_inside_one_function_selects_only_the_tests_that_ran_it(
    pytester: pytest.Pytester, project: Path, tmp_path: Path
) -> None:
    recorded = record(pytester, tmp_path)
    assert recorded.ran == MATH | DATA
    run = edit_mul_and_select(pytester, project, tmp_path)
    assert run.select["full_run"] is False
    assert run.select["selected"] == 3 and run.select["total"] == 7
    explain = subprocess.run(
        [sys.executable, "-m", "devpool.cli", "select", "--explain", "tests"],
        cwd=project,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "selected    tests/test_math.py::test_mul: code block lib.py::mul changed" in explain
    assert "deselected  tests/test_math.py::test_add: its" in explain


def test_recording_under_pytest_cov_measures_coverage_and_selects_as_without_it(
    pytester: pytest.Pytester, project: Path, tmp_path: Path
) -> None:
    # coverage.py holds the trace hook (3.11) or a sys.monitoring id of its own (3.12+);
    # devpool's watch uses another hook, so both see every test.
    pytest.importorskip("pytest_cov")
    ignore = project / ".gitignore"
    ignore.write_text(ignore.read_text() + ".coverage*\n")
    git(project, "commit", "-qam", "coverage data is not source")
    cov = ("-p", "pytest_cov", "--cov=lib", "--cov-report=term-missing")
    recorded = record(pytester, tmp_path, more=cov)
    assert recorded.ran == MATH | DATA
    assert re.search(r"^lib\.py\s+4\s+0\s+100%", recorded.output(), re.MULTILINE), recorded.output()
    edit_mul_and_select(pytester, project, tmp_path)


def test_a_data_file_or_a_declared_input_selects_its_readers(
    pytester: pytest.Pytester, project: Path, tmp_path: Path
) -> None:
    record(pytester, tmp_path)
    (project / "configs" / "model.yaml").write_text("depth: 3\n")
    run = Run(pytester, tmp_path, "data", "--devices", "sim:0-1", "--devpool-select", "on")
    assert run.ran == {"tests/test_data.py::test_reads_config", "tests/test_data.py::test_eight"}
    git(project, "checkout", "configs/model.yaml")
    (project / "kernels" / "b.cu").write_text("// a new kernel\n")  # untracked, in the glob
    run = Run(pytester, tmp_path, "glob", "--devices", "sim:0-1", "--devpool-select", "on")
    assert run.ran == {"tests/test_data.py::test_kernels", "tests/test_data.py::test_eight"}


def test_a_test_skipped_at_four_devices_is_selected_at_eight(
    pytester: pytest.Pytester, project: Path, tmp_path: Path
) -> None:
    recorded = record(pytester, tmp_path, devices="sim:0-3")
    assert "tests/test_data.py::test_eight" in recorded.ran  # skipped: unsatisfiable at 4
    run = Run(pytester, tmp_path, "eight", "--devices", "sim:0-7", "--devpool-select", "on")
    assert run.result.ret == 0, run.output()
    assert run.ran == {"tests/test_data.py::test_eight"}
    run.result.stdout.fnmatch_lines(["*1 passed, 6 deselected*"])


def test_a_changed_conftest_of_the_bucket_gives_a_full_run_with_the_reason(
    pytester: pytest.Pytester, project: Path, tmp_path: Path
) -> None:
    record(pytester, tmp_path)
    # A conftest.py outside the bucket keeps its baseline valid.
    write(project, {"tools/conftest.py": "# another bucket's conftest\n"})
    run = Run(pytester, tmp_path, "other", "--devices", "sim:0-1", "--devpool-select", "on")
    assert run.select["full_run"] is False and run.ran == {"tests/test_data.py::test_eight"}
    (project / "tests" / "conftest.py").write_text("# the bucket's conftest, edited\n")
    run = Run(pytester, tmp_path, "full", "--devices", "sim:0-1", "--devpool-select", "on")
    reason = "compatibility input changed: tests/conftest.py"
    assert run.select["full_run"] is True and run.select["reason"] == reason
    assert f"devpool select: full run: {reason}" in run.output()
    assert run.ran == MATH | DATA


def test_a_damaged_database_or_an_unaccounted_file_gives_a_full_run(
    pytester: pytest.Pytester, project: Path, tmp_path: Path
) -> None:
    record(pytester, tmp_path)
    (project / "Dockerfile").write_text("FROM python:3.11\n")
    git(project, "add", "Dockerfile")  # tracked: an input (an untracked one is not)
    run = Run(pytester, tmp_path, "docker", "--devices", "sim:0-1", "--devpool-select", "on")
    assert run.select["full_run"] is True
    assert run.select["reason"].startswith("Dockerfile changed and nothing accounts for it")
    assert run.ran == MATH | DATA
    git(project, "rm", "-q", "--cached", "Dockerfile")
    (project / "Dockerfile").unlink()
    (database,) = (project / ".devpool" / "select").glob("*/*/deps.json")
    database.write_bytes(database.read_bytes()[:-10])
    run = Run(pytester, tmp_path, "damaged", "--devices", "sim:0-1", "--devpool-select", "on")
    assert run.select["full_run"] is True
    assert run.select["reason"].endswith("its database is damaged (checksum mismatch)")
    assert "devpool select: full run: baseline" in run.output()
    assert run.ran == MATH | DATA


def test_auto_records_on_the_main_branch_and_selects_on_others(
    pytester: pytest.Pytester, project: Path, tmp_path: Path
) -> None:
    git(project, "branch", "-M", "main")
    auto = ("--devices", "sim:0-1", "--devpool-select", "auto")
    run = Run(pytester, tmp_path, "main", *auto)
    assert run.select["mode"] == "record" and "branch main is in full-on" in run.select["policy"]
    assert "devpool select: recorded baseline" in run.output()
    git(project, "checkout", "-q", "-b", "feature")
    lib = project / "lib.py"
    lib.write_text(lib.read_text().replace("return a + b", "return b + a"))
    run = Run(pytester, tmp_path, "feature", *auto)
    assert run.select["mode"] == "on" and run.select["full_run"] is False
    expected = {"tests/test_math.py::test_add", "tests/test_math.py::test_both"}
    assert run.ran == expected | {"tests/test_data.py::test_eight"}


def test_shadow_runs_everything_and_lists_the_misses(
    pytester: pytest.Pytester, project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record(pytester, tmp_path)
    generation = next((project / ".devpool" / "select").glob("*/*"))
    archive = tmp_path / "baseline.tar.gz"
    cli = [sys.executable, "-m", "devpool.cli", "select"]
    subprocess.run([*cli, "export", str(archive), "tests"], cwd=project, check=True)
    for path in sorted(generation.iterdir()):
        path.unlink()
    generation.rmdir()
    imported = subprocess.run(
        [*cli, "import", str(archive)], cwd=project, capture_output=True, text=True, check=True
    )
    assert generation.name in imported.stdout and (generation / "manifest.json").is_file()
    # An environment variable is invisible to recording: the failure it causes is a miss.
    monkeypatch.setenv("BREAK_PLAIN", "1")
    run = Run(pytester, tmp_path, "shadow", "--devices", "sim:0-1", "--devpool-select", "shadow")
    assert run.ran == MATH | DATA
    assert run.select["mode"] == "shadow" and run.select["selected"] == 1
    run.result.stdout.fnmatch_lines(
        ["devpool select: MISS tests/test_data.py::test_plain failed but would not have been*"]
    )
    (misses,) = [e for e in run.events if e["type"] == "select_misses"]
    assert misses["misses"] == ["tests/test_data.py::test_plain"]


SHARED = {
    "pyproject.toml": PROJECT["pyproject.toml"],
    ".gitignore": PROJECT[".gitignore"],
    "helpers.py": """
        def make_db():
            return {"rows": 3}


        def build_table():
            return [1, 2, 3]


        def unused():
            return None
        """,
    "tests/conftest.py": """
        import pytest

        import helpers


        @pytest.fixture(scope="session")
        def db():
            return helpers.make_db()
        """,
    "tests/test_one.py": """
        def test_one(db):
            assert db["rows"] == 3
        """,
    "tests/test_two.py": """
        import helpers

        TABLE = helpers.build_table()  # runs at import, before any test


        def test_two(db):
            assert db["rows"] == len(TABLE)


        def test_three():
            assert TABLE
        """,
}


def test_shared_fixtures_and_import_time_code_count_for_every_test_that_uses_them(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    root = pytester.path
    write(root, SHARED)
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "init")
    record(pytester, tmp_path)
    helpers = root / "helpers.py"
    original = helpers.read_text()
    # The session fixture is set up once, in whichever test comes first; both use it.
    helpers.write_text(original.replace('{"rows": 3}', '{"rows": 3, "x": 1}'))
    run = Run(pytester, tmp_path, "fixture", "--devices", "sim:0-1", "--devpool-select", "on")
    assert run.ran == {"tests/test_one.py::test_one", "tests/test_two.py::test_two"}
    helpers.write_text(original.replace("[1, 2, 3]", "[3, 2, 1]"))
    run = Run(pytester, tmp_path, "import", "--devices", "sim:0-1", "--devpool-select", "on")
    assert {"tests/test_two.py::test_two", "tests/test_two.py::test_three"} <= run.ran
    helpers.write_text(original.replace("return None", "return 0"))
    run = Run(pytester, tmp_path, "unused", "--devices", "sim:0-1", "--devpool-select", "on")
    assert run.ran == set(), run.output()


MACHINERY = {
    "pyproject.toml": PROJECT["pyproject.toml"],
    ".gitignore": PROJECT[".gitignore"],
    "helpers.py": """
        def prepare():
            return 1


        def used():
            return 2
        """,
    "tests/conftest.py": """
        import pytest

        import helpers


        @pytest.hookimpl(wrapper=True)
        def pytest_runtestloop(session):
            helpers.prepare()  # the run's machinery: before the first test, for none
            return (yield)
        """,
    "tests/test_a.py": """
        import helpers


        def test_a():
            assert helpers.used() == 2
        """,
}


def test_code_run_between_collection_and_the_first_test_is_no_tests(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """A worker's own start (a fork server's loop, a worker becoming one, the hooks of
    pytest_runtestloop) runs for no test: it selects none, where collection's code and a
    test's own do."""
    root = git_project(pytester.path, MACHINERY)
    record(pytester, tmp_path)
    helpers = root / "helpers.py"
    original = helpers.read_text()
    helpers.write_text(original.replace("return 1", "return 10"))
    run = Run(pytester, tmp_path, "loop", "--devices", "sim:0-1", "--devpool-select", "on")
    assert run.result.ret == 0 and run.ran == set(), run.output()
    helpers.write_text(original.replace("return 2", "return 2 + 0"))
    run = Run(pytester, tmp_path, "used", "--devices", "sim:0-1", "--devpool-select", "on")
    assert run.ran == {"tests/test_a.py::test_a"}, run.output()


FILES = {
    "pyproject.toml": PROJECT["pyproject.toml"],
    ".gitignore": PROJECT[".gitignore"],
    "tests/conftest.py": """
        import pytest


        class Check(pytest.Item):
            def runtest(self):
                assert self.path.read_text().strip() in ("ok", "fine")


        class CheckFile(pytest.File):
            def collect(self):
                yield Check.from_parent(self, name="check")


        def pytest_collect_file(file_path, parent):
            if file_path.name.startswith("check_") and file_path.suffix == ".txt":
                return CheckFile.from_parent(parent, path=file_path)
        """,
    "tests/check_a.txt": "ok\n",
    "tests/check_b.txt": "ok\n",
    "tests/util.py": """
        def double(x):
            \"\"\"
            >>> double(2)
            4
            \"\"\"
            return 2 * x
        """,
    "tests/test_util.py": """
        import util


        def test_double():
            assert util.double(3) == 6
        """,
}


def test_tests_from_other_files_depend_on_them_and_doctests_always_run(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    root = pytester.path
    write(root, FILES)
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "init")
    args = ("--devices", "sim:0-1", "--doctest-modules", "-p", "doctest")
    recorded = Run(pytester, tmp_path, "record", *args, "--devpool-select", "record")
    assert recorded.result.ret == 0, recorded.output()
    assert len(recorded.ran) == 4, recorded.ran
    (root / "tests" / "check_a.txt").write_text("fine\n")
    run = Run(pytester, tmp_path, "txt", *args, "--devpool-select", "on")
    assert run.ran == {"tests/check_a.txt::check", "tests/util.py::util.double"}, run.output()


# k.c is built into build/libk.so, whose own fingerprint covers it.
NATIVE = native_project("build")


def build(root: Path, value: int) -> None:
    build_library(root, "build", value)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/self/maps")
def test_a_rebuilt_shared_library_selects_the_tests_that_loaded_it(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    root = pytester.path
    write(root, NATIVE)
    build(root, 1)
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "init")
    # One process per test: a library one test loaded stays mapped in a warm worker.
    isolated = ("--devices", "sim:0-1", "--devpool-isolation", "job")
    record_run = Run(pytester, tmp_path, "record", *isolated, "--devpool-select", "record")
    assert record_run.result.ret == 0, record_run.output()
    build(root, 1)  # the same source rebuilt: same content, new mtime
    run = Run(pytester, tmp_path, "same", *isolated, "--devpool-select", "on")
    assert run.ran == set(), run.output()
    assert run.result.ret == 0  # a selection that keeps nothing is no "nothing collected"
    build(root, 2)
    git(root, "commit", "-qam", "k returns 2")
    run = Run(pytester, tmp_path, "rebuilt", *isolated, "--devpool-select", "on")
    assert run.ran == {"tests/test_native.py::test_native"}, run.output()


def test_a_checkout_with_scratch_files_and_a_run_folder_inside_selects_alike(
    tmp_path: Path,
) -> None:
    """A real checkout (issue 30): untracked and ignored files, and the README's CI recipe
    writing --devpool-run-dir=out/shard-1 inside the project. Plain pytest (testpaths)
    records; `devpool select` with no path finds that baseline; a scratch file changes
    nothing, tracked or ignored ones aside."""
    files = dict(PROJECT)
    files["pyproject.toml"] = PROJECT["pyproject.toml"] + '        testpaths = ["tests"]\n'
    files["tests/test_artifacts.py"] = """
        def test_artifacts(devpool_artifacts):
            kept = devpool_artifacts / "kept.txt"  # under out/shard-1: devpool's, no input
            kept.write_text("x")
            assert kept.read_text() == "x"
        """
    project = git_project(tmp_path / "checkout", files)
    (project / "notes.txt").write_text("untracked before the recording\n")
    (project / "build").mkdir()
    (project / "build" / "cache.bin").write_text("ignored\n")

    def pytest_run(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", *FAST, f"--devpool-lock-dir={tmp_path / 'locks'}"]
            + ["--devices", "sim:0-1", "--devpool-skip-unsatisfiable", *args],
            cwd=project,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    def select() -> str:
        return subprocess.run(
            [sys.executable, "-m", "devpool.cli", "select"],  # no path: testpaths, as pytest
            cwd=project,
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    pytest_run("--devpool-select", "record", "--devpool-run-dir=out/shard-1")
    assert any((project / "out" / "shard-1").iterdir())
    lib = project / "lib.py"
    lib.write_text(lib.read_text().replace("return a * b", "return b * a"))
    first = select()
    assert "full run" not in first, first
    chosen = {line.split()[1] for line in first.splitlines() if line.startswith("selected ")}
    assert {"tests/test_math.py::test_mul", "tests/test_math.py::test_both"} <= chosen
    assert "tests/test_math.py::test_add" not in chosen
    assert "tests/test_artifacts.py::test_artifacts" not in chosen
    (project / "scratch.txt").write_text("a note to self\n")
    (project / "build" / "cache.bin").write_text("rebuilt\n")
    (project / "out" / "shard-2").mkdir()
    (project / "out" / "shard-2" / "selected.txt").write_text("x\n")
    assert select() == first
    (project / ".gitignore").write_text(PROJECT[".gitignore"] + "out/\n")
    git(project, "commit", "-qam", "ignore out/")
    assert select() == first
