"""Which tests probably use a device: their source, scanned for device APIs (`devpool adopt`).

A guess from text, said as one: each finding names the line it saw. The test function's own
lines are read first, then its module's lines outside every other test function (fixtures,
helpers, module-level code).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# (what the line shows, pattern); the first that matches a line names it.
DEVICE_APIS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (".cuda(", re.compile(r"\.cuda\(")),
    ("torch.cuda", re.compile(r"\btorch\.cuda\b")),
    ("torch.npu", re.compile(r"\btorch\.npu\b|\btorch_npu\b")),
    ("device_count()", re.compile(r"\bdevice_count\(\)")),
    ('"cuda"', re.compile(r"""["']cuda(:\d+)?["']""")),
)
_TO_DEVICE = re.compile(r"\.to\(\s*(\w*device\w*)\s*\)")


@dataclass(frozen=True)
class Finding:
    """One line that suggests a test uses a device."""

    nodeid: str
    path: Path
    line: int  # 1-based
    text: str
    api: str


@dataclass(frozen=True)
class _Function:
    start: int  # first decorator's line, 1-based
    end: int
    params: frozenset[str]


@lru_cache(maxsize=256)
def _module(path: Path) -> tuple[tuple[str, ...], dict[tuple[str, ...], _Function]]:
    """The module's lines, and its test functions by (class, name) or (name,)."""
    try:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return (), {}
    functions: dict[tuple[str, ...], _Function] = {}

    def visit(body: list[ast.stmt], outer: tuple[str, ...]) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, (*outer, node.name))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                args = node.args
                params = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
                functions[outer + (node.name,)] = _Function(
                    first, node.end_lineno or node.lineno, frozenset(params)
                )

    visit(tree.body, ())
    return tuple(text.splitlines()), functions


def _hit(text: str, params: frozenset[str]) -> str | None:
    code = text.strip()
    if not code or code.startswith("#"):
        return None
    for api, pattern in DEVICE_APIS:
        if pattern.search(code):
            return api
    found = _TO_DEVICE.search(code)
    if found is not None and found.group(1) in params:
        return f".to({found.group(1)})"
    return None


def scan(nodeid: str, path: Path) -> Finding | None:
    """The first device API line of this test, else of its module outside other tests."""
    lines, functions = _module(path)
    if not lines:
        return None
    names = tuple(part.split("[", 1)[0] for part in nodeid.split("::")[1:])
    own = functions.get(names)
    tests = [f for key, f in functions.items() if key[-1].startswith("test") and f is not own]
    if own is not None:
        for number in range(own.start, own.end + 1):
            api = _hit(lines[number - 1], own.params)
            if api is not None:
                return Finding(nodeid, path, number, lines[number - 1].strip(), api)
    for number, text in enumerate(lines, 1):
        if any(f.start <= number <= f.end for f in tests) or (
            own is not None and own.start <= number <= own.end
        ):
            continue
        api = _hit(text, frozenset())
        if api is not None:
            return Finding(nodeid, path, number, text.strip(), api)
    return None
