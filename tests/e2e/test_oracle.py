"""Differential test: plain pytest is the oracle for devpool.

Hypothesis draws a deterministic target suite (a `Spec`: its size, its share of tests that
do not pass, its ini, devpool's isolation and fork server, and a seed that fixes every
test's kind), the suite runs once in plain pytest and once under `--devices sim:0-1`, and
the two runs must agree as a user reads them: each test's JUnit outcome, the closing
line's counts (warnings and subtests included), the short test summary's lines and -v's
result lines (in any order), the exit status. No rerun is asked, so devpool must not show
a flaky, rerun or infra word either. Fixed cases pin the scenarios of the bug report.

Both runs have the same plugins (autoload off; pytest's own, `subtests` included) and the
same folder, ini and PYTHONPATH; only devpool's plugin differs (`-p devpool.plugin` versus
`-p no:devpool`). The generated tests share no state, so their outcomes do not depend on
order or on which process runs them; fixtures that would legitimately differ when tests
are spread over processes (a teardown error of a module fixture, a warning in a module
fixture) are left out.

Shrinking is off (each example is two real sessions): a failing example is reproduced from
the `Spec` the assertion message prints, `build_suite(Spec(...))`.
"""

from __future__ import annotations

import itertools
import os
import random
import re
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from sessions import FAST, closing_line, text

# Devpool's run: its plugin named (autoload is off); the plain run blocks it by its entry
# point's name, with the same other arguments.
DEVPOOL_ARGS = (*FAST, "-p", "no:randomly")
PLAIN_ARGS = ("-p", "no:devpool", *FAST[2:], "-p", "no:randomly")
RUN_TIMEOUT = 240.0

# Words devpool prints only when it retried a test or blamed the infrastructure.
RETRY_WORDS = re.compile(r"\b(flaky|rerun\w*|infra\w*)\b", re.IGNORECASE)


@pytest.fixture(autouse=True)
def _no_autoload(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only pytest's own plugins (and devpool's, where named) in both runs and the workers."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


# ---- the suite ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """One target suite and how devpool runs it; `build_suite` makes the same files from it."""

    seed: int
    tests: int  # about this many test items (parametrize and unittest classes included)
    modules: int
    bad_share: float  # share of tests drawn from the kinds that do not pass
    filterwarnings_error: bool
    isolation: str  # worker, module or job
    fork_server: bool
    verbosity: str = ""  # "", "-q" or "-v": -q and -v count passed subtests, the default not
    report_chars: str = ""  # "" (pytest's fE) or "-rA": every outcome in the short summary

    def common_args(self) -> tuple[str, ...]:
        return tuple(arg for arg in (self.verbosity, self.report_chars) if arg)

    def devpool_args(self) -> tuple[str, ...]:
        args = ["--devices", "sim:0-1", f"--devpool-isolation={self.isolation}"]
        if not self.fork_server:
            args.append("--devpool-no-fork-server")
        return tuple(args)


GOOD = ("pass", "skip", "xfail", "xpass", "warn", "deprecation", "subtests_pass", "param")
BAD = (
    "fail",
    "setup_error",
    "teardown_error",
    "xpass_strict",
    "subtests_fail",
    "param_mixed",
    "module_fixture_error",
)

CONFTEST = """\
import pytest


@pytest.fixture(scope="session")
def session_res():
    return "session"


@pytest.fixture(scope="class")
def class_res():
    return "class"


@pytest.fixture
def broken_setup():
    raise RuntimeError("fixture setup failed")


@pytest.fixture
def broken_teardown():
    yield "value"
    raise RuntimeError("fixture teardown failed")
"""

MODULE_HEAD = """\
import decimal
import enum
import pathlib
import unittest
import warnings

import pytest


@pytest.fixture(scope="module")
def module_res():
    return __name__


@pytest.fixture(scope="module")
def module_broken():
    raise RuntimeError("module fixture setup failed")


class Color(enum.Enum):
    RED = 1

"""

# What a subtest is told about itself (subtests.test(**kwargs)): pytest shows their repr.
SUBTEST_VALUES = (
    "None",
    "1.5",
    "True",
    '"text"',
    "(1, 2)",
    "[3, 4]",
    '{1: "int key"}',
    'b"bytes"',
    "complex(1, 2)",
    'decimal.Decimal("1.5")',
    'pathlib.PurePosixPath("a/b")',
    "frozenset({1})",
    "range(3)",
    "Color.RED",
)


def ini(spec: Spec) -> str:
    lines = ["[pytest]", "markers =", "    device_count(n): devpool's marker"]
    if spec.filterwarnings_error:
        lines += ["filterwarnings =", "    error"]
    return "\n".join(lines) + "\n"


class _Writer:
    """Writes one module's tests; names carry their kind (test_0007_fail) for the diffs."""

    def __init__(self, rng: random.Random, numbers: Iterator[int]) -> None:
        self.rng = rng
        self.numbers = numbers
        self.lines: list[str] = []

    def name(self, kind: str) -> str:
        return f"test_{next(self.numbers):04d}_{kind}"

    def marker(self) -> list[str]:
        roll = self.rng.random()
        if roll < 0.2:
            return ["@pytest.mark.device_count(1)"]
        if roll < 0.3:
            return ["@pytest.mark.device_count(2)"]
        return []

    def fixtures(self, in_class: bool) -> list[str]:
        pool = ["session_res", "module_res"] + (["class_res"] if in_class else [])
        return [f for f in pool if self.rng.random() < 0.3]

    def function(self, kind: str, indent: str = "", in_class: bool = False) -> int:
        """One test function (a method when in_class) of this kind; how many items it makes."""
        rng = self.rng
        decorators = self.marker()
        args = self.fixtures(in_class)
        body = ["assert True"]
        items = 1
        if kind == "fail":
            body = ["assert False"]
        elif kind == "skip":
            how = rng.randrange(3)
            if how == 0:
                decorators.append('@pytest.mark.skip(reason="not today")')
            elif how == 1:
                decorators.append('@pytest.mark.skipif(True, reason="never here")')
            else:
                body = ['pytest.skip("skipped at run time")']
        elif kind == "xfail":
            decorators.append('@pytest.mark.xfail(reason="known bug")')
            body = ["assert False"]
        elif kind == "xpass":
            decorators.append('@pytest.mark.xfail(reason="maybe fixed")')
        elif kind == "xpass_strict":
            decorators.append('@pytest.mark.xfail(strict=True, reason="must fail")')
        elif kind == "setup_error":
            args.append("broken_setup")
        elif kind == "teardown_error":
            args.append("broken_teardown")
            body = [rng.choice(["assert broken_teardown", "assert False"])]
        elif kind == "module_fixture_error":
            args.append("module_broken")
        elif kind == "warn":
            body = [f'warnings.warn(UserWarning("user warning {rng.randrange(1000)}"))']
        elif kind == "deprecation":
            body = ['warnings.warn(DeprecationWarning("old api"))']
        elif kind in ("subtests_pass", "subtests_fail"):
            args.append("subtests")
            count = rng.randint(1, 5)
            bad = (
                sorted(rng.sample(range(count), rng.randint(1, count)))
                if kind == "subtests_fail"
                else []
            )
            value = rng.choice(SUBTEST_VALUES)
            msg = rng.choice(['"part"', "None"])
            body = [
                f"for i in range({count}):",
                f'    with subtests.test(msg={msg}, i=i, label="p" + str(i), value={value}):',
                f"        assert i not in {bad!r}",
            ]
        elif kind in ("param", "param_mixed"):
            values: list[object] = list(range(rng.randint(2, 4)))
            if rng.random() < 0.5:
                values = [f"v{v}" for v in values]
            bad = [v for v in values if rng.random() < 0.5] if kind == "param_mixed" else []
            if kind == "param_mixed" and not bad:
                bad = [values[0]]
            decorators.append(f'@pytest.mark.parametrize("value", {values!r})')
            args.append("value")
            body = [f"assert value not in {bad!r}"]
            items = len(values)
        if in_class:
            args.insert(0, "self")
        out = [
            *decorators,
            f"def {self.name(kind)}({', '.join(args)}):",
            *("    " + b for b in body),
        ]
        self.lines += [indent + line for line in out] + [""]
        return items

    def unittest_class(self, bad_share: float, room: int) -> int:
        rng = self.rng
        methods = rng.randint(1, min(room, 4))
        self.lines += [f"class TestUnit{next(self.numbers):04d}(unittest.TestCase):"]
        for _ in range(methods):
            if rng.random() < bad_share:
                kind = rng.choice(["fail", "unexpected_success", "subtest_fail", "error"])
            else:
                kind = rng.choice(["pass", "skip", "skip_call", "expected_failure", "subtest"])
            decorator = {
                "skip": ['@unittest.skip("not today")'],
                "expected_failure": ["@unittest.expectedFailure"],
                "unexpected_success": ["@unittest.expectedFailure"],
            }.get(kind, [])
            body = {
                "fail": ["self.assertEqual(1, 2)"],
                "error": ['raise RuntimeError("unittest error")'],
                "skip_call": ['self.skipTest("skipped at run time")'],
                "expected_failure": ["self.assertTrue(False)"],
                "subtest": [
                    "for i in range(3):",
                    f"    with self.subTest(i=i, value={rng.choice(SUBTEST_VALUES)}):",
                    "        pass",
                ],
                "subtest_fail": [
                    "for i in range(3):",
                    f'    with self.subTest("part", i=i, value={rng.choice(SUBTEST_VALUES)}):',
                    "        self.assertNotEqual(i, 1)",
                ],
            }.get(kind, ["self.assertTrue(True)"])
            self.lines += ["    " + d for d in decorator]
            self.lines += [f"    def {self.name(kind)}(self):", *("        " + b for b in body), ""]
        self.lines.append("")
        return methods

    def plain_class(self, bad_share: float, room: int) -> int:
        rng = self.rng
        decorators = self.marker()
        self.lines += [*decorators, f"class TestGroup{next(self.numbers):04d}:"]
        items = 0
        for _ in range(rng.randint(1, min(room, 4))):
            kind = rng.choice(
                ("fail", "setup_error", "xpass_strict")
                if rng.random() < bad_share
                else ("pass", "skip", "xfail", "warn")
            )
            items += self.function(kind, indent="    ", in_class=True)
        self.lines.append("")
        return items


def build_suite(spec: Spec) -> dict[str, str]:
    """The target project's files (relative path → text); the same spec, the same files."""
    rng = random.Random(spec.seed)
    numbers = itertools.count()
    files = {"pytest.ini": ini(spec), "conftest.py": CONFTEST}
    per_module = [
        spec.tests // spec.modules + (m < spec.tests % spec.modules) for m in range(spec.modules)
    ]
    for m, budget in enumerate(per_module):
        writer = _Writer(rng, numbers)
        while budget > 0:
            roll = rng.random()
            if roll < 0.1 and budget >= 1:
                budget -= writer.unittest_class(spec.bad_share, budget)
            elif roll < 0.18:
                budget -= writer.plain_class(spec.bad_share, budget)
            else:
                kinds = BAD if rng.random() < spec.bad_share else GOOD
                kind = rng.choice(kinds)
                if kind.startswith("param") and budget < 4:
                    kind = "fail" if kind == "param_mixed" else "pass"
                budget -= writer.function(kind)
        files[f"test_m{m}.py"] = MODULE_HEAD + "\n".join(writer.lines)
    return files


@st.composite
def specs(draw: st.DrawFn) -> Spec:
    isolation = draw(st.sampled_from(["worker", "module", "job"]))
    fork_server = draw(st.booleans())
    # Mostly small suites, now and then a big one. A process per test costs ~0.1 s forked
    # and a whole pytest start (~1 s on 2 cores) unforked, so job isolation stays small.
    big = draw(st.integers(0, 9)) == 9
    tests = draw(st.integers(61, 400) if big else st.integers(5, 60))
    if isolation == "job":
        tests = min(tests, draw(st.integers(1, 60 if fork_server else 12)))
    bad_share = draw(st.sampled_from([0.0, 0.1, 0.3, 0.5, 1.0]) | st.floats(0.0, 1.0))
    return Spec(
        seed=draw(st.integers(0, 2**32 - 1)),
        tests=tests,
        modules=draw(st.integers(1, min(6, tests))),
        bad_share=round(bad_share, 3),
        filterwarnings_error=draw(st.booleans()),
        isolation=isolation,
        fork_server=fork_server,
        verbosity=draw(st.sampled_from(["", "-q", "-v"])),
        report_chars=draw(st.sampled_from(["", "-rA"])),
    )


# ---- what each run shows ------------------------------------------------------------------


def junit_outcomes(xml: Path) -> dict[tuple[str, str], tuple[tuple[str, str], ...]]:
    """(classname, name) → its outcome elements in order: (failure|error|skipped, message),
    or (("passed", ""),) for a test case with none."""
    seen: dict[tuple[str, str], tuple[tuple[str, str], ...]] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        key = (case.get("classname", ""), case.get("name", ""))
        parts = tuple(
            (child.tag, ((child.get("message") or "").splitlines() or [""])[0][:160])
            for child in case
            if child.tag in ("failure", "error", "skipped")
        )
        seen[key] = seen.get(key, ()) + (parts or (("passed", ""),))
    return seen


def closing_counts(line: str) -> dict[str, int]:
    """'== 3 failed, 1 passed, 2 warnings, 2 subtests passed in 0.06s ==' → the counts."""
    body = re.sub(r"\s+in [\d.]+s\b.*$", "", line.strip().strip("=").strip())
    counts: dict[str, int] = {}
    for part in body.split(", "):
        found = re.fullmatch(r"(\d+) (.+)", part.strip())
        if found is None:
            counts[f"unparsed: {part.strip()}"] = 1
            continue
        noun = {"warning": "warnings", "error": "errors"}.get(found[2], found[2])
        counts[noun] = counts.get(noun, 0) + int(found[1])
    return counts


def short_summary(result: pytest.RunResult) -> list[str]:
    """The lines of pytest's short test summary (SUBFAILED[part] (i=1) ..., FAILED ...)."""
    lines = result.outlines
    header = re.compile(r"=+ short test summary info =+")
    starts = [i for i, line in enumerate(lines) if header.fullmatch(line)]
    if not starts:
        return []
    section = [line for line in lines[starts[-1] + 1 :] if line.strip()]
    return [line for line in section[:-1] if not line.startswith("=")]  # not the closing line


def verbose_results(result: pytest.RunResult) -> list[str]:
    """-v's result lines as 'test_m0.py::test_x SUBPASSED[part] (i=0)', without the [ NN%].

    devpool writes them as pytest writes xdist's, naming where each ran
    (`[sim:2,3] [ 50%] PASSED test_m0.py::test_x`): read into the same shape. As under xdist,
    a skip's or xfail's reason is not on that line; it is compared in the short summary.
    Not those of unittest classes (TestUnitNNNN): for a unittest subTest, pytest 9.0 itself
    prints a -v line with no status word, where devpool's replay prints SUBPASSED; the
    short summary and the counts still compare them."""
    plain = re.compile(r"(\S+::\S.*?)\s+\[\s*\d+%\]")
    xdist = re.compile(
        r"\[[^\]]+\] \[\s*\d+%\] (SUB\w+(?:\[[^\]]*\])?(?: ?\(.*?\))?|[A-Z]+) (\S+::.*?) ?"
    )
    reason = re.compile(r" (SKIPPED|XFAIL|XPASS) \(.*\)$")
    lines = []
    for line in result.outlines:
        if found := plain.fullmatch(line):
            lines.append(reason.sub(r" \1", found[1]))
        elif found := xdist.fullmatch(line):
            lines.append(f"{found[2]} {found[1]}")
    return [line for line in lines if "::TestUnit" not in line]


def devpool_lines(result: pytest.RunResult) -> list[str]:
    return [line for line in result.outlines if line.lstrip("= ").startswith("devpool:")]


# ---- the comparison -----------------------------------------------------------------------


def _show(parts: tuple[tuple[str, str], ...] | None) -> str:
    if parts is None:
        return "(missing)"
    return " + ".join(tag + (f" ({msg})" if msg else "") for tag, msg in parts)


def _tags(parts: tuple[tuple[str, str], ...] | None) -> tuple[str, ...] | None:
    return None if parts is None else tuple(tag for tag, _ in parts)


def _lines_differ(what: str, plain: list[str], devpool: list[str]) -> list[str]:
    """Lines each run printed, in any order (devpool prints in completion order)."""
    a, b = Counter(plain), Counter(devpool)
    if a == b:
        return []
    only = [f"    - {line}" for line in sorted((a - b).elements())]
    only += [f"    + {line}" for line in sorted((b - a).elements())]
    more = [f"    ... and {len(only) - 16} more"] if len(only) > 16 else []
    return [f"{what} lines differ (- only plain, + only devpool):", *only[:16], *more]


def differences(
    spec_text: str,
    kinds: Counter[str],
    plain: pytest.RunResult,
    devpool: pytest.RunResult,
    plain_xml: Path,
    devpool_xml: Path,
) -> list[str]:
    """What differs between the two runs, as lines a reader can act on; [] when none."""
    problems: list[str] = []
    if plain.ret != devpool.ret:
        problems.append(f"exit status: plain {int(plain.ret)}, devpool {int(devpool.ret)}")
    plain_counts = closing_counts(closing_line(plain))
    devpool_counts = closing_counts(closing_line(devpool))
    if plain_counts != devpool_counts:
        problems.append(f"closing line: plain {plain_counts}, devpool {devpool_counts}")
    problems += _lines_differ("short test summary", short_summary(plain), short_summary(devpool))
    problems += _lines_differ("-v result", verbose_results(plain), verbose_results(devpool))
    # Anywhere in its output: the generated tests never print those words themselves.
    retry = [line for line in devpool.outlines + devpool.errlines if RETRY_WORDS.search(line)]
    if retry:
        problems.append("devpool speaks of retries/infra though none was asked:")
        problems += ["    " + line for line in retry[:8]]
    if not plain_xml.is_file() or not devpool_xml.is_file():
        found = f"plain {plain_xml.is_file()}, devpool {devpool_xml.is_file()}"
        problems.append(f"JUnit file written: {found}")
    else:
        a, b = junit_outcomes(plain_xml), junit_outcomes(devpool_xml)
        diff = [key for key in sorted(set(a) | set(b)) if _tags(a.get(key)) != _tags(b.get(key))]
        if diff:
            problems.append(f"{len(diff)} of {len(a)} tests differ in JUnit (classname::name):")
            for key in diff[:25]:
                problems.append(
                    f"    {key[0]}::{key[1]}\n        plain:   {_show(a.get(key))}"
                    f"\n        devpool: {_show(b.get(key))}"
                )
            if len(diff) > 25:
                problems.append(f"    ... and {len(diff) - 25} more")
    if not problems:
        return []
    tail = devpool.outlines[-25:]
    return [
        f"devpool disagrees with plain pytest on {spec_text}",
        f"kinds drawn: {dict(sorted(kinds.items()))}",
        f"plain:   {closing_line(plain)}",
        f"devpool: {closing_line(devpool)}",
        *problems,
        "devpool's last lines:",
        *("  | " + line for line in tail),
    ]


_examples = itertools.count()


def compare(
    pytester: pytest.Pytester,
    lock: Path,
    files: dict[str, str],
    devpool_args: tuple[str, ...],
    what: str,
    plain_counts: dict[str, int] | None = None,
    common: tuple[str, ...] = (),
) -> None:
    """Write the project in a fresh folder, run it both ways there, fail on any difference."""
    n = next(_examples)
    where = pytester.mkdir(f"example{n}")
    for name, body in files.items():
        (where / name).write_text(body)
    kinds = Counter(
        m[1] for body in files.values() for m in re.finditer(r"def test_\d{4}_(\w+)\(", body)
    )
    locks = lock / f"example{n}"
    locks.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(where)  # both runs: this folder is cwd, rootdir and on PYTHONPATH
        plain = pytester.runpytest_subprocess(
            *PLAIN_ARGS, *common, "--junitxml=plain.xml", timeout=RUN_TIMEOUT
        )
        # The harness itself: the plain run had no devpool (no run folder, no devpool lines).
        assert not (where / ".devpool").exists(), text(plain)
        assert not devpool_lines(plain), text(plain)
        devpool = pytester.runpytest_subprocess(
            *DEVPOOL_ARGS,
            *common,
            f"--devpool-lock-dir={locks}",
            *devpool_args,
            "--junitxml=devpool.xml",
            timeout=RUN_TIMEOUT,
        )
    # ... and the devpool run really was one (-q hides its header lines, not its run folder).
    assert list((where / ".devpool" / "runs").glob("*/record.jsonl")), text(devpool)
    if plain_counts is not None:  # the oracle's side of a pinned scenario, as reported
        assert closing_counts(closing_line(plain)) == plain_counts, text(plain)
    problems = differences(what, kinds, plain, devpool, where / "plain.xml", where / "devpool.xml")
    assert not problems, "\n".join(problems)


# ---- hypothesis: any suite ----------------------------------------------------------------


@settings(
    max_examples=8,
    deadline=None,
    database=None,
    # CI draws the same suites every run (a red CI names a reproducible case); elsewhere
    # each run draws new ones.
    derandomize=os.environ.get("CI") == "true",
    phases=(Phase.explicit, Phase.generate),  # no shrinking: each example is two sessions
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(spec=specs())
def test_devpool_agrees_with_plain_pytest(
    pytester: pytest.Pytester, lock: Path, spec: Spec
) -> None:
    compare(
        pytester, lock, build_suite(spec), spec.devpool_args(), repr(spec), None, spec.common_args()
    )


# ---- the scenarios of the bug report, pinned ----------------------------------------------

ONE_LINERS = "\n".join(
    f"def test_{i:03d}():\n    assert {'False' if i % 10 < 3 else 'True'}\n" for i in range(300)
)

MODULE_FIXTURES = """\
import warnings

import pytest


@pytest.fixture(scope="module")
def conn():
    return {"open": True}


@pytest.fixture(scope="module")
def table(conn):
    return [1, 2, 3]


def test_conn(conn):
    assert conn["open"]


def test_table(table):
    assert sum(table) == 6


@pytest.mark.device_count(1)
def test_on_device(conn, table):
    assert len(table) == 3


def test_fails(table):
    assert table == []


def test_warns():
    warnings.warn(UserWarning("turned into an error"))
"""

SUBTESTS = """\
import decimal
import pathlib

import pytest


def test_subtests(subtests):
    for i in range(5):
        with subtests.test(msg="part", i=i, name="n" + str(i), pair=(i, i)):
            assert i % 2 == 0


def test_subtests_objects(subtests):
    where = pathlib.PurePosixPath("a/b")
    for value in (decimal.Decimal("1.5"), b"raw", {1: "int key"}, None):
        with subtests.test(value=value, where=where):
            assert value is None


@pytest.mark.parametrize("size", [1, 2])
def test_subtests_param(subtests, size):
    for i in range(3):
        with subtests.test(i=i, size=size):
            assert i < 2


def test_passes():
    pass
"""

WARNINGS = """\
import warnings

import pytest


def test_user_warning():
    warnings.warn(UserWarning("counted once"))


@pytest.mark.device_count(1)
def test_two_warnings():
    warnings.warn(UserWarning("first"))
    warnings.warn(DeprecationWarning("second"))


@pytest.mark.parametrize("n", [1, 2])
def test_param_warns(n):
    warnings.warn(UserWarning(f"param {n}"))


def test_quiet():
    pass
"""

# What a test sees of the cyclic collector: import-time objects are referrers and referents
# as in plain pytest, and a cycle dropped at import is collected (a frozen heap hid all
# three; anyio's tests failed on the first).
GC_SEES = """\
import gc
import weakref

import pytest


class Node:
    pass


MODULE_THING = Node()
_cycle = Node()
_cycle.me = _cycle
DROPPED = weakref.ref(_cycle)
del _cycle


@pytest.mark.device_count(1)
def test_module_object_has_its_module_as_referrer():
    assert any(r is globals() for r in gc.get_referrers(MODULE_THING))


def test_module_object_is_in_get_objects():
    assert any(o is MODULE_THING for o in gc.get_objects())


@pytest.mark.device_count(1)
def test_a_cycle_dropped_at_import_is_collected():
    gc.collect()
    assert DROPPED() is None
"""

GC_FILES = {"pytest.ini": "[pytest]\nmarkers =\n    device_count(n)\n", "test_gc.py": GC_SEES}

PINNED = {
    "300 one-liners, 30% assert False": (
        {"pytest.ini": "[pytest]\n", "test_many.py": ONE_LINERS},
        ("--devices", "sim:0-1"),
        (),
        {"failed": 90, "passed": 210},
    ),
    "filterwarnings=error, module fixtures, forked module isolation": (
        {
            "pytest.ini": "[pytest]\nfilterwarnings =\n    error\nmarkers =\n    device_count(n)\n",
            "test_a.py": MODULE_FIXTURES,
            "test_b.py": MODULE_FIXTURES,
        },
        ("--devices", "sim:0-1", "--devpool-isolation=module"),
        (),
        {"failed": 4, "passed": 6},
    ),
    "warnings in tests are counted": (
        {"pytest.ini": "[pytest]\nmarkers =\n    device_count(n)\n", "test_warn.py": WARNINGS},
        ("--devices", "sim:0-1"),
        (),
        {"passed": 5, "warnings": 5},
    ),
    **{
        f"gc sees what plain pytest sees, {mode}, fork server {fork}": (
            GC_FILES,
            ("--devices", "sim:0-1", f"--devpool-isolation={mode}")
            + (() if fork == "on" else ("--devpool-no-fork-server",)),
            (),
            {"passed": 3},
        )
        for mode in ("worker", "module", "job")
        for fork in ("on", "off")
    },
    "failing subtests": (
        {"pytest.ini": "[pytest]\n", "test_sub.py": SUBTESTS},
        ("--devices", "sim:0-1"),
        ("-v", "-rA"),  # -v: passed subtests are counted and listed too
        {"failed": 11, "passed": 1, "subtests passed": 8},
    ),
}


@pytest.mark.parametrize("scenario", list(PINNED))
def test_bug_report_scenarios_agree_with_plain_pytest(
    pytester: pytest.Pytester, lock: Path, scenario: str
) -> None:
    files, devpool_args, common, plain_counts = PINNED[scenario]
    what = f"{scenario!r} with {' '.join((*common, *devpool_args))}"
    compare(pytester, lock, files, devpool_args, what, plain_counts, common)
