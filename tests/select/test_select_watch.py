"""The watches (select/watch.py) against the truth, over random programs (hypothesis).

Each example writes a module of functions that call each other (an acyclic graph, some
calls in loops, some through generators) and whose top level calls some of them at import.
Then, in stretches, the watch runs while entry functions are called, or while a fresh copy
of the module is imported, and is asked what ran. What it names in that file must be
exactly what the calls reach: nothing missed (a missed function is a test not selected),
nothing from an earlier stretch. What an import ran must be named as the import's.
"""

from __future__ import annotations

import importlib
import itertools
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devpool.select import watch

WATCHES = [
    *(["monitoring"] if sys.version_info >= (3, 12) else []),
    *(["native"] if watch._calls is not None else []),
    *(["profiler"] if sys.version_info < (3, 12) else []),
    "trace",
]
_names = itertools.count()


@st.composite
def programs(draw: st.DrawFn) -> tuple[list[list[int]], list[bool], list[int]]:
    """Functions 0..n-1: whom each calls (higher numbers only), whether it is a generator,
    and what the module's top level calls."""
    n = draw(st.integers(2, 10))
    calls = [
        draw(st.lists(st.integers(i + 1, n - 1), max_size=3)) if i < n - 1 else [] for i in range(n)
    ]
    generators = [draw(st.booleans()) for _ in range(n)]
    top = draw(st.lists(st.integers(0, n - 1), max_size=2))
    return calls, generators, top


def source(calls: list[list[int]], generators: list[bool], top: list[int]) -> str:
    lines = []
    for i, callees in enumerate(calls):
        lines.append(f"def f{i}():")
        for j in callees:
            # a generator's body runs only when it is iterated
            lines.append(f"    for _ in range(2): list(f{j}())" if generators[j] else f"    f{j}()")
        lines.append(f"    yield {i}" if generators[i] else f"    return {i}")
    lines.extend(f"list(f{j}())" if generators[j] else f"f{j}()" for j in top)
    return "\n".join(lines) + "\n"


def reached(calls: list[list[int]], roots: list[int]) -> set[str]:
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        i = stack.pop()
        if i not in seen:
            seen.add(i)
            stack.extend(calls[i])
    return {f"f{i}" for i in seen}


def names(codes: watch.Codes, path: Path) -> set[str]:
    return {code.co_name for code in codes.values() if code.co_filename == str(path)}


def make(which: str) -> watch.Watch:
    if which == "monitoring":
        monitor = watch.Monitor(4, lambda filename: "watched_" in filename)
        sys.addaudithook(monitor.audit)  # a Recorder passes it the events of its own hook
        return monitor
    return {"native": watch.NativeHook, "profiler": watch.Profiler, "trace": watch.Tracer}[which]()


@pytest.fixture(scope="module")
def hooks() -> Iterator[dict[str, watch.Watch]]:
    """One watch of each kind for all examples (a Monitor's audit hook stays for good)."""
    made: dict[str, watch.Watch] = {}
    yield made
    for which, hook in made.items():  # leave no hook behind for the rest of the process
        hook.stop()
        hook.take()
        if which == "monitoring":
            sys.monitoring.free_tool_id(4)
        elif which == "profiler":
            threading.setprofile(None)  # type: ignore[arg-type]
        elif which == "trace":
            threading.settrace(None)  # type: ignore[arg-type]


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))


@pytest.mark.parametrize("which", WATCHES)
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    program=programs(),
    stretches=st.lists(
        st.one_of(st.none(), st.lists(st.integers(0, 9), max_size=3)), min_size=1, max_size=5
    ),
)
def test_a_watch_names_exactly_what_ran_and_what_an_import_ran(
    which: str,
    hooks: dict[str, watch.Watch],
    folder: Path,
    program: tuple[list[list[int]], list[bool], list[int]],
    stretches: list[list[int] | None],
) -> None:
    calls, generators, top = program
    name = f"watched_{next(_names)}"
    path = folder / f"{name}.py"
    path.write_text(source(calls, generators, top))
    module = importlib.import_module(name)  # unwatched: the first stretch sees no import
    if which not in hooks:
        hooks[which] = make(which)
    hook = hooks[which]
    for stretch in stretches:
        assert hook.start() == ""
        if stretch is None:  # an import of a fresh copy of the module
            copy = folder / f"{name}_{next(_names)}.py"
            copy.write_text(path.read_text())
            importlib.import_module(copy.stem)
            expected = reached(calls, top) | {"<module>"}
            watched = copy
        else:
            roots = [i % len(calls) for i in stretch]
            for i in roots:
                result = getattr(module, f"f{i}")()
                if generators[i]:
                    list(result)
            expected = reached(calls, roots)
            watched = path
        assert hook.stop() == ""
        codes, imported = hook.take()
        assert names(codes, watched) == expected
        assert names(imported, watched) == (expected if stretch is None else set())
