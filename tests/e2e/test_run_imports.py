"""The fixed cost of a run (issue 45): a plain local run imports only what it uses.

A real session on simulated devices writes, from its conftest, the modules its controller
and its worker hold when the session ends. Neither holds the queue, selective runs, the
multi-rank merge, sharding or coverage: those load only for a run that asks for them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sessions import FAST

CONFTEST = """
import json
import os
import sys
from pathlib import Path

OUT = Path({out!r})


def pytest_unconfigure(config):
    role = "controller" if config.pluginmanager.has_plugin("devpool-controller") else "worker"
    names = sorted(name for name in sys.modules if name.split(".")[0] in ("devpool", "coverage"))
    (OUT / f"{{role}}-{{os.getpid()}}.json").write_text(json.dumps(names))
"""

# What a plain local run loads only when a run asks for it (a prefix matches the package).
NOT_USED = (
    "devpool.queue",
    "devpool.select.record",
    "devpool.select.session",
    "devpool.select.baseline",
    "devpool.backends.ranks",
    "devpool.backends.merge",
    "devpool.backends.failfast",
    "devpool.capacity.shards",
    "devpool.report.markdown",
    "coverage",
)


def _loaded(out: Path, role: str) -> list[str]:
    files = sorted(out.glob(f"{role}-*.json"))
    assert files, f"no {role} wrote its modules"
    return sorted({name for path in files for name in json.loads(path.read_text())})


def test_a_plain_local_run_imports_no_queue_selection_ranks_or_merge(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    out = tmp_path / "modules"
    out.mkdir()
    pytester.makeconftest(CONFTEST.format(out=str(out)))
    pytester.makepyfile(
        test_plain="""
        import pytest

        def test_cpu():
            assert 1 + 1 == 2

        @pytest.mark.device_count(1)
        def test_device():
            assert 2 * 2 == 4
        """
    )
    result = pytester.runpytest_subprocess(
        *FAST, "--devices", "sim:0-1", f"--devpool-lock-dir={tmp_path / 'locks'}", timeout=120
    )
    result.assert_outcomes(passed=2)
    for role in ("controller", "worker"):
        loaded = _loaded(out, role)
        assert "devpool.plugin" in loaded  # the hook ran where devpool did
        used = [name for name in loaded if name.startswith(NOT_USED)]
        assert used == [], f"the {role} of a plain local run imported {used}"
