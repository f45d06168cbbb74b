"""The warnings count and the warnings summary are plain pytest's, in every isolation mode:
warnings raised while collecting, by each test, and by fixtures wider than a test (which
each worker sets up again, where plain pytest sets them up once). Plain pytest runs the same
suite in the same test and is the expected value."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from sessions import closing_line, run

PLAIN = ("-p", "devpool.plugin", "-p", "no:cacheprovider")

CONFTEST = """
import warnings
import pytest

@pytest.fixture(scope="session")
def model():
    warnings.warn("loading the model the slow way", UserWarning)
    return 1
"""

LAZY = """
import warnings
warnings.warn("lazylib is deprecated", DeprecationWarning, stacklevel=2)
VALUE = 1
"""

ON_IMPORT = """
import warnings
warnings.warn("toplib warns on import", UserWarning)
"""

FIRST = """
import warnings
import pytest
import toplib

warnings.warn("module level", UserWarning)

@pytest.fixture(scope="module")
def data():
    warnings.warn("module data", DeprecationWarning)
    return 2

def helper():
    warnings.warn("from helper", UserWarning)

@pytest.mark.parametrize("i", range(6))
def test_param(model, data, i):
    helper()

def test_lazy():
    import lazylib
    assert lazylib.VALUE

@pytest.mark.device_count(1)
def test_on_a_device(data):
    import quietlib
    assert quietlib.VALUE
    warnings.warn(DeprecationWarning("device deprecated"))

@pytest.mark.device_count(1)
def test_quiet_import():
    import quietlib
    assert quietlib.VALUE
"""

SECOND = """
import warnings
import pytest

warnings.warn("module level b", RuntimeWarning)

class TestGroup:
    @pytest.fixture(scope="class")
    def shared(self):
        warnings.warn("class fixture", FutureWarning)

    @pytest.mark.parametrize("x", ["p", "q", "r"])
    def test_method(self, shared, model, x):
        warnings.warn(f"method {x}", UserWarning)

@pytest.fixture(scope="module", params=["a", "b"])
def flavour(request):
    warnings.warn(f"flavour {request.param}", UserWarning)
    return request.param

@pytest.mark.parametrize("n", range(3))
def test_flavoured(flavour, n):
    pass

def test_lazy_too():
    import lazylib
    assert lazylib.VALUE
"""


@pytest.fixture(autouse=True)
def _only_named_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)


def counts(result: pytest.RunResult) -> str:
    return re.sub(r" in [0-9.]+s.*$", "", closing_line(result).strip("= "))


def summary(result: pytest.RunResult) -> str:
    """The warnings summary as printed: its entries, their tests, in order."""
    out = result.stdout.str()
    assert "warnings summary" in out, out
    return out.split("warnings summary", 1)[1].split("-- Docs:", 1)[0]


@pytest.mark.parametrize("isolation", ["worker", "module", "job"])
def test_warnings_count_and_summary_are_plain_pytests(
    pytester: pytest.Pytester,
    lock: Path,
    isolation: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The lazily imported libraries live outside the project, where a template may preload
    # what the tests imported last run (history/preload.py).
    libraries = tmp_path / "site"
    libraries.mkdir()
    (libraries / "lazylib.py").write_text(LAZY)
    (libraries / "quietlib.py").write_text("VALUE = 2\n")
    monkeypatch.setenv("PYTHONPATH", str(libraries))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(toplib=ON_IMPORT, test_first=FIRST, test_second=SECOND)
    expected = pytester.runpytest_subprocess(*PLAIN, timeout=120)
    assert "warning" in counts(expected)

    # Twice: the second run's templates first import what the tests imported last time.
    for _ in range(2):
        result = run(pytester, lock, "--devices=sim:0-3", f"--devpool-isolation={isolation}")
        assert result.ret == expected.ret == 0
        assert counts(result) == counts(expected)
        assert summary(result) == summary(expected)
        listed = json.loads((pytester.path / ".devpool/history.preload.json").read_text())
        assert "quietlib" in listed["kinds"]["1"], listed  # preloaded by the second run
        assert "lazylib" not in listed["kinds"]["1"], listed  # its import warned
