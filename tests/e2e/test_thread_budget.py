"""The thread budget (issue 45), across real sessions: every worker, forked or fresh, and
every process a test starts sees OMP_NUM_THREADS and its kin as its share of the cores;
torch, imported by the conftest before any worker forked, runs that many threads; a
variable the user set wins, nonsense included; a cgroup quota narrows the cores; a
cpus(n) test holds n CPU slots and gets n threads; bad cpus markers are one sentence."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from sessions import records, run, suite, text

from devpool.devices.cores import CGROUP_ROOT_ENV
from openmp_library import build_openmp_library

SEEN = """
import subprocess
import sys


def seen(key):
    torch = sys.modules.get("torch")
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.environ.get('OMP_NUM_THREADS'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    record(
        key,
        omp=os.environ.get("OMP_NUM_THREADS"),
        blas=os.environ.get("OPENBLAS_NUM_THREADS"),
        torch=torch.get_num_threads() if torch is not None else None,
        child=child,
    )


@pytest.mark.parametrize("i", range(3))
def test_cpu(i):
    seen(f"cpu{i}")


@pytest.mark.device_count(1)
def test_device():
    seen("device")


@pytest.mark.cpus(2)
def test_two_cores():
    seen("two")
"""

# One device and two CPU slots, whatever the host has.
TWO_SLOTS = ("--devices", "sim:0", "--devpool-cpu-slots=2")
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@pytest.fixture(autouse=True)
def no_autoload(monkeypatch: pytest.MonkeyPatch) -> None:
    """sessions.run names devpool's plugin itself: no other plugin loads (nor devpool twice)."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


@pytest.fixture
def no_thread_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a host where the user set none: the budget is devpool's to give."""
    for name in (*THREAD_VARIABLES, "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("NUMEXPR_NUM_THREADS", raising=False)
    monkeypatch.delenv("DEVPOOL_THREADS", raising=False)
    monkeypatch.delenv(CGROUP_ROOT_ENV, raising=False)


def cores() -> int:
    return len(os.sched_getaffinity(0))


def project(pytester: pytest.Pytester, out: Path, torch: bool) -> None:
    if torch:
        pytester.makeconftest("import torch  # noqa: F401  (before the zygote forks)\n")
    suite(pytester, out, "test_threads.py", SEEN)


@pytest.mark.parametrize("fork", ["--devpool-fork-server", "--devpool-no-fork-server"])
def test_the_budget_reaches_forked_and_fresh_workers_their_torch_and_subprocesses(
    pytester: pytest.Pytester, lock: Path, no_thread_variables: None, fork: str
) -> None:
    if importlib.util.find_spec("torch") is None:  # not imported here: pytester unloads it
        pytest.skip("torch is not installed")
    out = pytester.mkdir("out")
    project(pytester, out, torch=True)
    # 2 CPU slots and 1 device, max-parallel max(1, 2): 2 tests at once, cores // 2 each.
    args = ("--devices", "sim:0", "--devpool-cpu-slots=2", fork)
    result = run(pytester, lock, *args, timeout=180)
    assert result.ret == 0, text(result)
    share = str(max(1, cores() // 2))
    seen = records(out)
    assert set(seen) == {"cpu0", "cpu1", "cpu2", "device", "two"}
    for key in ("cpu0", "cpu1", "cpu2", "device"):
        assert seen[key]["omp"] == seen[key]["blas"] == seen[key]["child"] == share, seen[key]
        assert seen[key]["torch"] == int(share), seen[key]
    # cpus(2): two threads, in a worker of its own kind, forked from the same template.
    assert seen["two"]["omp"] == seen["two"]["child"] == "2", seen["two"]
    assert seen["two"]["torch"] == 2, seen["two"]
    header = [line for line in result.outlines if line.startswith("devpool: threads:")]
    assert header == [
        f"devpool: threads: {share} per test ({cores()} core{'s' if cores() != 1 else ''} by "
        "affinity, 2 tests at once; cpus(n) gets n); in OMP_NUM_THREADS and its kin"
    ]


def test_plain_pytest_gives_no_budget_so_the_budget_is_devpools(
    pytester: pytest.Pytester, no_thread_variables: None
) -> None:
    """The oracle: the same suite under plain pytest sees no thread variable at all."""
    out = pytester.mkdir("out")
    project(pytester, out, torch=False)
    result = pytester.runpytest_subprocess("-p", "no:devpool", "-p", "no:cacheprovider")
    assert result.ret == 0, text(result)
    assert {r["omp"] for r in records(out).values()} == {None}


def test_a_variable_the_user_set_wins_and_nonsense_is_passed_through_with_one_line(
    pytester: pytest.Pytester,
    lock: Path,
    no_thread_variables: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = pytester.mkdir("out")
    project(pytester, out, torch=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    kept = run(pytester, lock, "--devices", "sim:0", timeout=120)
    assert kept.ret == 0, text(kept)
    seen = records(out)
    assert {r["omp"] for r in seen.values()} == {"3"}
    assert {r["child"] for r in seen.values()} == {"3"}
    # The kin the user left alone still get the budget (2 for the cpus(2) test).
    assert {seen[k]["blas"] for k in ("cpu0", "device")} == {str(max(1, cores() // 2))}
    assert seen["two"]["blas"] == "2"
    assert "yours kept: OMP_NUM_THREADS=3" in text(kept)
    assert "warning" not in text(kept)

    monkeypatch.setenv("OMP_NUM_THREADS", "abc")
    nonsense = run(pytester, lock, "--devices", "sim:0", timeout=120)
    assert nonsense.ret == 0, text(nonsense)
    assert {r["omp"] for r in records(out).values()} == {"abc"}
    warnings = [line for line in nonsense.outlines if "OMP_NUM_THREADS='abc'" in line]
    assert len(warnings) == 1, text(nonsense)
    assert "not a whole number" in warnings[0]


def test_a_cgroup_quota_narrows_the_cores(
    pytester: pytest.Pytester,
    lock: Path,
    no_thread_variables: None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """A fake cgroup v2 tree with a quota of 1.5 cores: 2 cores at most, the CPU slots and
    the header follow (a v1 tree is read by tests/devices/test_cores.py)."""
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cpu.max").write_text("150000 100000\n")
    monkeypatch.setenv(CGROUP_ROOT_ENV, str(root))
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    result = run(pytester, lock, "--devices", "sim:0", timeout=120)
    assert result.ret == 0, text(result)
    allowed = min(cores(), 2)
    if cores() > 2:
        assert f"{allowed} cores (cgroup quota 1.5 of {cores()} by affinity)" in text(result)
    assert f"cpu slots {allowed}" in text(result)


CPUS_SUITE = """
@pytest.mark.cpus(2)
def test_wide():
    record("wide-start", at=time.time())
    time.sleep(1.0)
    record("wide-end", at=time.time())


@pytest.mark.parametrize("i", range(6))
def test_narrow(i):
    record(f"narrow{i}-start", at=time.time())
    time.sleep(0.2)
    record(f"narrow{i}-end", at=time.time())
"""


def test_cpus_n_holds_n_cpu_slots(pytester: pytest.Pytester, lock: Path) -> None:
    """With 2 CPU slots, nothing else runs while a cpus(2) test does; the narrow tests
    still run two at a time before or after it."""
    out = pytester.mkdir("out")
    suite(pytester, out, "test_cpus.py", CPUS_SUITE)
    result = run(
        pytester,
        lock,
        *TWO_SLOTS,
        timeout=120,
    )
    assert result.ret == 0, text(result)
    seen = records(out)
    wide = (seen["wide-start"]["at"], seen["wide-end"]["at"])
    narrow = [(seen[f"narrow{i}-start"]["at"], seen[f"narrow{i}-end"]["at"]) for i in range(6)]
    for start, end in narrow:
        assert end <= wide[0] or start >= wide[1], (wide, narrow)
    overlapping = sum(1 for a in narrow for b in narrow if a < b and a[0] < b[1] and b[0] < a[1])
    assert overlapping > 0, narrow  # two slots: narrow tests do run side by side


@pytest.mark.parametrize(
    ("marker", "said"),
    [
        ("cpus(0)", "@pytest.mark.cpus(0) needs a whole number ≥ 1, got int 0"),
        ("cpus(-1)", "@pytest.mark.cpus(-1) needs a whole number ≥ 1, got int -1"),
        ("cpus('2')", "@pytest.mark.cpus('2') needs a whole number ≥ 1, got str '2'"),
        ("cpus(3)", "@pytest.mark.cpus(3) needs 3 cores; this run has 2 CPU slots"),
    ],
)
def test_bad_cpus_markers_are_one_sentence(
    pytester: pytest.Pytester, lock: Path, marker: str, said: str
) -> None:
    pytester.makepyfile(
        test_bad=f"import pytest\n\n\n@pytest.mark.{marker}\ndef test_x():\n    pass\n"
    )
    result = run(
        pytester,
        lock,
        *TWO_SLOTS,
        timeout=60,
    )
    assert result.ret == 4, text(result)
    errors = [line for line in result.errlines if line.startswith("ERROR:")]
    assert len(errors) == 1 and "test_bad.py::test_x: " + said in errors[0], text(result)
    assert "Traceback" not in text(result)


def test_cpus_above_the_slots_skips_with_skip_unsatisfiable(
    pytester: pytest.Pytester, lock: Path
) -> None:
    pytester.makepyfile(
        test_big="import pytest\n\n\n@pytest.mark.cpus(3)\ndef test_big():\n    pass\n\n\n"
        "def test_small():\n    pass\n"
    )
    result = run(
        pytester,
        lock,
        *TWO_SLOTS,
        "--devpool-skip-unsatisfiable",
        "-rs",
        timeout=60,
    )
    assert result.ret == 0, text(result)
    result.assert_outcomes(passed=1, skipped=1)
    assert "needs 3 cores; this run has 2 CPU slots" in text(result)


def test_a_path_rule_gives_cpus_as_the_marker_does(pytester: pytest.Pytester, lock: Path) -> None:
    """[tool.devpool.paths] with cpus = 2: the tests under it get two threads."""
    pytester.makepyprojecttoml('[tool.devpool.paths]\n"test_heavy.py" = { cpus = 2 }\n')
    pytester.makepyfile(
        test_heavy="import os\n\n\ndef test_h():\n    assert os.environ['DEVPOOL_THREADS'] == '2'\n"
    )
    plan = run(pytester, lock, "--devices", "sim:0", "--devpool-plan", timeout=60)
    assert any(line.split()[1:] == ["2", "cpus", "test_heavy.py::test_h"] for line in plan.outlines)
    result = run(
        pytester,
        lock,
        *TWO_SLOTS,
        timeout=60,
    )
    result.assert_outcomes(passed=1)


def test_with_one_thread_each_a_parallel_op_at_import_keeps_the_template_forkable(
    pytester: pytest.Pytester, lock: Path, no_thread_variables: None, tmp_path: Path
) -> None:
    """The budget's other gain: a pool of one thread starts no thread, so a module that runs
    an OpenMP op at import no longer makes its template unsafe (tests/e2e/test_fork_server.py
    shows the same module with two threads: fresh processes, and a line saying why)."""
    if cores() // 2 > 1:
        pytest.skip("here the budget is above one thread")
    library = build_openmp_library(tmp_path)
    pytester.makepyfile(
        test_golden=f"""
        import ctypes
        import pytest

        LIB = ctypes.CDLL({str(library)!r})
        LIB.parallel_sum.restype = ctypes.c_double
        GOLDEN = LIB.parallel_sum(200000)  # a parallel op at import, as torch.softmax is


        @pytest.mark.device_count(1)
        @pytest.mark.parametrize("i", range(3))
        def test_parallel(i):
            assert LIB.parallel_sum(200000) == GOLDEN
        """
    )
    result = run(pytester, lock, "--devices", "sim:0-1", timeout=120)
    result.assert_outcomes(passed=3)
    assert "not safe to fork" not in text(result)
