"""Plugins that keep state over the whole session (syrupy, pytest-benchmark), and plugins
devpool has not met: plain pytest and devpool run the same project, and agree.

The expected files, exit codes and benchmark names come from plain pytest in the same test.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("syrupy")
pytest.importorskip("pytest_benchmark")

DEVPOOL = ("--devices", "sim:0-3", "--devpool-cpu-slots", "2")
NO_RANDOM = ("-p", "no:randomly")

SNAPSHOT_TESTS = {
    "test_a.py": """
import pytest

@pytest.mark.parametrize("n", range(4))
def test_square(snapshot, n):
    assert {"n": n, "square": n * n} == snapshot

@pytest.mark.device_count(1)
def test_text(snapshot):
    assert "hello" == snapshot
""",
    "test_b.py": """
import pytest

@pytest.mark.device_count(2)
def test_pair(snapshot):
    assert [1, 2] == snapshot

def test_two_snapshots(snapshot):
    assert "first" == snapshot
    assert "second" == snapshot
""",
}


@pytest.fixture(autouse=True)
def _plain_environment(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every plugin on (after tests/conftest.py's pytester turned some off)."""
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)


def project(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    tests = root / "tests"
    tests.mkdir(exist_ok=True)
    for name, body in files.items():
        (tests / name).write_text(body)
    return root


def run(pytester: pytest.Pytester, root: Path, *args: str) -> pytest.RunResult:
    pytester.chdir()
    return pytester.run(
        *pytester._getpytestargs(),  # noqa: SLF001 - python -m pytest, as runpytest_subprocess
        "--rootdir",
        str(root),
        "-c",
        str(root / "pyproject.toml"),
        str(root / "tests"),
        *NO_RANDOM,
        *args,
        timeout=180,
    )


def devpool_run(
    pytester: pytest.Pytester, root: Path, tmp_path: Path, isolation: str, *args: str
) -> pytest.RunResult:
    locks = f"--devpool-lock-dir={tmp_path / 'locks'}"
    return run(pytester, root, *DEVPOOL, locks, f"--devpool-isolation={isolation}", *args)


def snapshot_files(root: Path) -> dict[str, str]:
    """Every file under the snapshot folders (sidecars included), with its content's hash."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("__snapshots__/*"))
        if path.is_file()
    }


@pytest.mark.parametrize("isolation", ["worker", "job"])
def test_syrupy_writes_keeps_and_removes_what_plain_pytest_does(
    pytester: pytest.Pytester, tmp_path: Path, isolation: str
) -> None:
    plain = project(tmp_path / "plain", SNAPSHOT_TESTS)
    under = project(tmp_path / "devpool", SNAPSHOT_TESTS)

    # --snapshot-update on a project with no snapshots: the same files, byte for byte.
    expected = run(pytester, plain, "--snapshot-update")
    got = devpool_run(pytester, under, tmp_path, isolation, "--snapshot-update")
    assert got.ret == expected.ret == 0
    written = snapshot_files(plain)
    assert written, "plain pytest wrote no snapshot: the test proves nothing"
    assert (
        snapshot_files(under) == {k.replace("plain", "devpool", 1): v for k, v in written.items()}
        or snapshot_files(under) == written
    )

    # A green run: the same exit code, and no snapshot file touched.
    expected = run(pytester, plain)
    got = devpool_run(pytester, under, tmp_path, isolation)
    assert (got.ret, expected.ret) == (0, 0), got.stdout.str()
    assert snapshot_files(under) == written

    # One test removed: its snapshot is unused over the whole run (exit code as plain's) ...
    for root in (plain, under):
        test_a = root / "tests" / "test_a.py"
        test_a.write_text(test_a.read_text().replace("def test_text", "def _not_a_test"))
    expected = run(pytester, plain)
    got = devpool_run(pytester, under, tmp_path, isolation)
    assert expected.ret == 1 and got.ret == expected.ret, got.stdout.str()
    assert snapshot_files(under) == written  # reported, never removed without an update

    # ... and --snapshot-update removes exactly it, as plain pytest does.
    run(pytester, plain, "--snapshot-update")
    devpool_run(pytester, under, tmp_path, isolation, "--snapshot-update")
    after = snapshot_files(plain)
    assert after != written
    assert snapshot_files(under) == after


def test_syrupy_a_deselected_tests_snapshot_is_never_removed(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """-k runs some tests: the others' snapshots are not unused, in plain pytest or devpool."""
    plain = project(tmp_path / "plain", SNAPSHOT_TESTS)
    under = project(tmp_path / "devpool", SNAPSHOT_TESTS)
    run(pytester, plain, "--snapshot-update")
    shutil.rmtree(under / "tests")
    shutil.copytree(plain / "tests", under / "tests")
    written = snapshot_files(plain)
    expected = run(pytester, plain, "-k", "square", "--snapshot-update")
    got = devpool_run(pytester, under, tmp_path, "worker", "-k", "square", "--snapshot-update")
    assert got.ret == expected.ret == 0
    assert snapshot_files(plain) == written
    assert snapshot_files(under) == written


BENCHMARK_TESTS = {
    "test_bench.py": """
import json, os, time
from pathlib import Path

def _mark(name):
    start = time.time()
    yield
    with open(os.environ["SPANS"], "a") as out:
        out.write(json.dumps([name, start, time.time()]) + "\\n")

def test_sum(benchmark):
    for _ in _mark("test_sum"):
        benchmark.pedantic(sum, args=(range(1000),), rounds=20, iterations=5)

def test_sorted(benchmark):
    benchmark.extra_info["size"] = 300
    for _ in _mark("test_sorted"):
        benchmark.pedantic(sorted, args=(list(range(300, 0, -1)),), rounds=20)

def test_not_a_benchmark():
    for _ in _mark("test_not_a_benchmark"):
        time.sleep(0.2)
""",
    "test_cpu.py": """
import json, os, time
import pytest

@pytest.mark.parametrize("n", range(6))
def test_busy(n):
    start = time.time()
    time.sleep(0.2)
    with open(os.environ["SPANS"], "a") as out:
        out.write(json.dumps([f"test_busy[{n}]", start, time.time()]) + "\\n")
""",
}


def test_benchmark_one_table_every_benchmark_in_the_json_and_nothing_beside_them(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = project(tmp_path / "plain", BENCHMARK_TESTS)
    under = project(tmp_path / "devpool", BENCHMARK_TESTS)
    monkeypatch.setenv("SPANS", str(tmp_path / "plain-spans.jsonl"))
    expected = run(pytester, plain, f"--benchmark-json={tmp_path / 'plain.json'}")
    monkeypatch.setenv("SPANS", str(tmp_path / "spans.jsonl"))
    got = devpool_run(
        pytester, under, tmp_path, "worker", f"--benchmark-json={tmp_path / 'dp.json'}"
    )
    assert got.ret == expected.ret == 0, got.stdout.str()

    def names(path: Path) -> list[tuple[str, dict[str, object]]]:
        data = json.loads(path.read_text())
        return [
            (b["fullname"], b["extra_info"]) for b in data["benchmarks"] if b["stats"]["rounds"]
        ]

    assert names(tmp_path / "dp.json") == names(tmp_path / "plain.json")
    assert len(names(tmp_path / "plain.json")) == 2

    def tables(result: pytest.RunResult) -> int:
        return sum(1 for line in result.outlines if "benchmark: " in line and " tests" in line)

    assert tables(got) == tables(expected) == 1, got.stdout.str()
    assert "no benchmarks have been run" not in got.stdout.str() + got.stderr.str()

    spans = [json.loads(line) for line in (tmp_path / "spans.jsonl").read_text().splitlines()]
    assert len(spans) == 9
    busy = [s for s in spans if s[0].startswith("test_busy")]
    assert any(a[1] < b[2] and b[1] < a[2] for a in busy for b in busy if a is not b), (
        "the CPU tests never overlapped: two slots would not show a benchmark runs alone"
    )
    for name, start, end in spans:
        if name in ("test_sum", "test_sorted"):
            beside = [s[0] for s in spans if s[0] != name and s[1] < end and start < s[2]]
            assert not beside, f"{name} ran beside {beside}"


def test_a_plugin_devpool_does_not_know_that_ends_sessions_is_named_once(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    root = project(tmp_path / "p", {"test_x.py": "def test_x():\n    pass\n"})
    (root / "tests" / "conftest.py").write_text("pytest_plugins = ['endwriter']\n")
    (root / "tests" / "endwriter.py").write_text(
        "def pytest_sessionfinish(session):\n"
        "    (session.config.rootpath / 'summary.txt').write_text('done')\n"
    )
    got = devpool_run(pytester, root, tmp_path, "worker")
    assert got.ret == 0, got.stdout.str()
    lines = [line for line in got.outlines if "pytest_sessionfinish of" in line]
    assert len(lines) == 1 and "endwriter" in lines[0], got.stdout.str()
    # A run with only plugins devpool knows says nothing of the kind.
    quiet = project(tmp_path / "q", SNAPSHOT_TESTS)
    got = devpool_run(pytester, quiet, tmp_path, "worker", "--snapshot-update")
    assert not [line for line in got.outlines if "pytest_sessionfinish of" in line]
