"""End to end: --devpool-isolation module gives every test module processes of its own.

Real pytest sessions on simulated devices; each test writes the pid it ran in to a file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

BODY = """
import json
import os
from pathlib import Path

import pytest

OUT = Path({out!r})


@pytest.mark.parametrize("i", range({n}))
def test_here(i):
    (OUT / f"{{__name__}}-{{i}}.json").write_text(json.dumps(os.getpid()))
"""


def _pids(out: Path) -> dict[str, set[int]]:
    """Module → the pids its tests ran in."""
    found: dict[str, set[int]] = {}
    for path in out.glob("*.json"):
        module = path.stem.rsplit("-", 1)[0]
        found.setdefault(module, set()).add(json.loads(path.read_text()))
    return found


@pytest.fixture(autouse=True)
def _only_devpool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # no other plugin interferes


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    lock_dir = pytester.path / "locks"
    return pytester.runpytest_subprocess(
        "-p",
        "devpool.plugin",
        "-p",
        "no:cacheprovider",
        f"--devpool-lock-dir={lock_dir}",
        "--devices",
        "sim:0-1",
        "--devpool-cpu-slots",
        "2",
        *args,
        timeout=120,
    )


def test_each_module_runs_in_processes_no_other_module_uses(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    for name in ("test_a", "test_b", "test_c"):
        pytester.makepyfile(**{name: BODY.format(out=str(out), n=30)})
    result = _run(pytester, "--devpool-isolation", "module")
    assert result.ret == 0, result.stdout.str()
    result.assert_outcomes(passed=90)
    pids = _pids(out)
    assert set(pids) == {"test_a", "test_b", "test_c"}
    for module, mine in pids.items():
        others = {pid for name, theirs in pids.items() if name != module for pid in theirs}
        assert not mine & others, f"{module} shared a process with another module: {pids}"
    # Not a process per test: a module's tests run together (one process, unless the
    # order splits the module).
    assert all(len(mine) < 30 for mine in pids.values()), pids


def test_warm_workers_share_processes_across_modules(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    for name in ("test_a", "test_b", "test_c"):
        pytester.makepyfile(**{name: BODY.format(out=str(out), n=30)})
    result = _run(pytester)
    assert result.ret == 0, result.stdout.str()
    every = set().union(*_pids(out).values())
    assert len(every) <= 2, f"two CPU workers ran all 90 tests: {_pids(out)}"


def test_an_unknown_isolation_is_one_clear_sentence(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_a="def test_a():\n    pass\n")
    result = _run(pytester, "--devpool-isolation", "file")
    assert result.ret == 4
    text = result.stdout.str() + result.stderr.str()
    assert "'module' (a fresh process per test module)" in text
    assert "Traceback" not in text
