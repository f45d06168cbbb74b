"""The package layout of src/devpool (ARCHITECTURE.md, "Layout"), read from an AST import graph.

Every import counts, a function's deferred ones too: a circle hidden in a function body is
still a circle. A package is a folder below devpool; each top-level module is a room of
its own.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import devpool

SRC = Path(devpool.__file__).resolve().parent
MAX_TOP_LEVEL = 12
MAX_LINES = 500  # a module; over it, two concerns share a room (STYLE.md)
MAX_CLASS_LINES = 300


def _modules() -> dict[str, Path]:
    """Dotted module name → file, for every module of the package."""
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(path: Path, name: str, known: Mapping[str, Path]) -> set[str]:
    """The devpool modules one module imports, anywhere in its body."""
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*here[: len(here) - node.level + 1], *filter(None, [base])])
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    found.add(f"{base}.{alias.name}")  # a module of a package
                elif base in known:
                    found.add(base)
    found.discard(name)
    return found


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: _imported(path, name, known) for name, path in known.items()}


def _circles(graph: Mapping[str, set[str]]) -> Iterator[list[str]]:
    """The strongly connected parts of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(node: str) -> Iterator[list[str]]:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                yield from visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            part = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                part.append(top)
                if top == node:
                    break
            if len(part) > 1:
                yield sorted(part)

    for node in sorted(graph):
        if node not in index:
            yield from visit(node)


def _room(module: str) -> str:
    """devpool.run.loop → devpool.run; a top-level module is its own room."""
    return ".".join(module.split(".")[:2])


def test_the_graph_sees_a_deferred_import() -> None:
    graph = _graph()
    assert "devpool.devices.shares" in graph["devpool.devices.lockdir"]
    assert "devpool.backends.ray.cluster" in graph["devpool.plugin"]  # deferred, in a function


def test_a_circle_is_found_wherever_it_closes() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert list(_circles(graph)) == [["a", "b", "c"]]


def test_no_module_imports_itself_back_in_a_circle() -> None:
    assert list(_circles(_graph())) == []


def test_imports_between_packages_run_one_way() -> None:
    rooms: dict[str, set[str]] = {}
    for module, imported in _graph().items():
        rooms.setdefault(_room(module), set()).update(
            _room(other) for other in imported if _room(other) != _room(module)
        )
    assert list(_circles(rooms)) == []


def test_the_top_level_holds_only_the_entry_points_and_shared_types() -> None:
    top = sorted(path.name for path in SRC.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, top


def test_no_module_is_over_the_line_limit() -> None:
    over = {}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            over[rel] = lines
    assert over == {}, f"over {MAX_LINES} lines: {over}"


def _class_sizes() -> dict[str, int]:
    """ "file::Class" → its lines, for every class of the package (nested ones too)."""
    sizes = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                sizes[f"{rel}::{node.name}"] = (node.end_lineno or node.lineno) - node.lineno + 1
    return sizes


def test_no_class_is_over_the_line_limit() -> None:
    sizes = _class_sizes()
    over = {name: lines for name, lines in sizes.items() if lines > MAX_CLASS_LINES}
    assert over == {}, f"over {MAX_CLASS_LINES} lines: {over}"


def test_no_two_classes_share_a_name() -> None:
    """One name for one thing: a class name found in two modules is two things a reader
    (and a grep) takes for one."""
    where: dict[str, list[str]] = {}
    for qualified in _class_sizes():
        rel, name = qualified.split("::")
        where.setdefault(name, []).append(rel)
    twice = {name: files for name, files in where.items() if len(files) > 1}
    assert twice == {}, f"class names defined more than once: {twice}"


def test_a_ray_node_actor_imports_no_pytest() -> None:
    """Every job on Ray starts a rank actor, a Ray worker process that imports its class's
    module: pytest (and devpool's controller) stay out of it, as they cost every rank."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import devpool.backends.ray.actor, devpool.backends.ray.node_templates\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pytest', '_pytest')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout


def test_no_two_test_modules_share_a_basename() -> None:
    """Test folders have no __init__.py: pytest imports each test module by its basename, and
    a second file of the same name stops the whole suite's collection ("import file
    mismatch"), which a run of one folder never shows."""
    tests = Path(__file__).resolve().parent
    seen: dict[str, list[str]] = {}
    for path in sorted(tests.rglob("*.py")):
        plain = path.name != "conftest.py" and "__pycache__" not in path.parts  # pytest's own
        if plain and not (path.parent / "__init__.py").exists():
            seen.setdefault(path.name, []).append(str(path.relative_to(tests)))
    assert {name: where for name, where in seen.items() if len(where) > 1} == {}
