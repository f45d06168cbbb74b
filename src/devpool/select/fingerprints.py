"""Fingerprints: code blocks of Python files, data files, shared libraries.

A Python file is cut into blocks: each function on its own (its body, signature and
decorators) and the module's top-level code (everything outside function bodies,
signatures and decorators included, but for pytest marks: a test's parametrize or skipif
list is its own block's alone). Hashes come from the AST without line numbers, so a moved
function or an edited comment changes nothing, while any edit inside one body changes that
block alone.
"""

from __future__ import annotations

import ast
import ctypes
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOP = "<module>"  # the block name of a module's top-level code
_CHUNK = 1 << 20


def file_hash(path: Path) -> str | None:
    """sha256 of a file's content; None when it cannot be read (gone, a folder)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


def text_hash(text: str) -> str:
    """sha256 of a text's UTF-8 bytes."""
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class ModuleBlocks:
    """One Python file's blocks: key → hash, and the line span of each function."""

    rel: str  # the file, relative to the rootdir, posix
    hashes: dict[str, str]
    spans: tuple[tuple[int, int, str], ...]  # (first line, last line, key), outer first

    def block_at(self, line: int) -> str:
        """The key of the innermost function holding this line, else the top level."""
        found = self.key(TOP)
        for start, end, key in self.spans:
            if start <= line <= end:
                found = key  # spans are outer first: the last match is the innermost
        return found

    def key(self, name: str) -> str:
        """The baseline's key of a block of this file: "path::qualified.name"."""
        return f"{self.rel}::{name}"


def blocks_of_source(rel: str, source: str) -> ModuleBlocks:
    """Cut a module's source into blocks; a file that does not parse is one block."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ModuleBlocks(rel, {f"{rel}::{TOP}": text_hash(source)}, ())
    hashes: dict[str, str] = {}
    spans: list[tuple[int, int, str]] = []
    seen: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in _statements(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                seen[name] = seen.get(name, 0) + 1
                if seen[name] > 1:  # the same name defined again (if/else, redefinition)
                    name = f"{name}#{seen[name]}"
                key = f"{rel}::{name}"
                start = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                spans.append((start, child.end_lineno or child.lineno, key))
                visit(child, name + ".<locals>.")
                # Children first: their bodies are already blanked, so this hash covers
                # this body alone; then blank it for the blocks around it.
                hashes[key] = text_hash(ast.dump(child))
                child.body = [ast.Pass()]
                # A mark (parametrize, skipif, ...) is data on this function alone: its
                # block's, not the top level's, which every test of the module depends on.
                child.decorator_list = [d for d in child.decorator_list if not _is_mark(d)]
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    hashes[f"{rel}::{TOP}"] = text_hash(ast.dump(tree))
    return ModuleBlocks(rel, hashes, tuple(spans))


def _is_mark(decorator: ast.expr) -> bool:
    """Whether a decorator is a pytest mark: `pytest.mark.NAME`, `mark.NAME`, called or not."""
    node = decorator.func if isinstance(decorator, ast.Call) else decorator
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return False
    names.append(node.id)  # innermost last: ["parametrize", "mark", "pytest"]
    return len(names) >= 2 and names[1] == "mark" and names[-1] in ("pytest", "mark")


# Where a def can stand: the statement lists of a statement (if, for, while, with, try,
# match and its cases, except handlers). Expressions hold no def (a lambda is no block).
_BODIES = ("body", "orelse", "finalbody", "handlers", "cases")


def _statements(node: ast.AST) -> list[ast.AST]:
    found: list[ast.AST] = []
    for field in _BODIES:
        value = getattr(node, field, None)
        if isinstance(value, list):
            for child in value:
                if isinstance(child, (ast.stmt, ast.excepthandler, ast.match_case)):
                    found.append(child)
    return found


class BlockCache:
    """Blocks of the project's Python files under root, parsed once per (size, mtime)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._cache: dict[str, tuple[tuple[int, int], ModuleBlocks]] = {}

    def rel(self, filename: str) -> str | None:
        """The path relative to root when it is one of the project's own files, else None."""
        return project_rel(self.root, filename)

    def blocks(self, rel: str) -> ModuleBlocks | None:
        """The blocks of one file (relative to root); None when it is gone or not text."""
        path = self.root / rel
        try:
            stat = path.stat()
        except OSError:
            return None
        stamp = (stat.st_size, stat.st_mtime_ns)
        cached = self._cache.get(rel)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None
        blocks = blocks_of_source(rel, source)
        self._cache[rel] = (stamp, blocks)
        return blocks


_EXCLUDED_PARTS = {"site-packages", "dist-packages", ".git", ".devpool", "__pycache__", ".tox"}


def project_rel(root: Path, filename: str) -> str | None:
    """filename relative to root (posix) when it is inside root and not an installed package."""
    if not filename or filename.startswith("<"):
        return None
    path = os.path.abspath(filename)
    base = str(root)
    if not path.startswith(base + os.sep):
        return None
    rel = path[len(base) + 1 :]
    parts = rel.split(os.sep)
    if _EXCLUDED_PARTS.intersection(parts) or any(p.startswith((".venv", "venv")) for p in parts):
        return None
    return "/".join(parts)


class ProjectPaths:
    """project_rel, remembered for each file asked about: the recorder's and a watched
    process's (children.py) way from a code object's filename to a spot's path."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._rel: dict[str, str | None] = {}

    def rel(self, filename: str) -> str | None:
        """The file's path relative to the rootdir (posix) when it is the project's."""
        if filename not in self._rel:
            self._rel[filename] = project_rel(self.root, filename)
        return self._rel[filename]

    def source(self, filename: str) -> str | None:
        """The same for one of the project's Python files, else None."""
        rel = self.rel(filename)
        return rel if rel is not None and rel.endswith(".py") else None


def library_stamp(path: str) -> tuple[int, int] | None:
    """(size, mtime in ns) of a shared library; None when it is gone."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_size, stat.st_mtime_ns)


class _LinkerInfo(ctypes.Structure):
    """glibc's and musl's struct dl_phdr_info, up to the load and unload counters."""

    _fields_ = [
        ("addr", ctypes.c_void_p),
        ("name", ctypes.c_char_p),
        ("phdr", ctypes.c_void_p),
        ("phnum", ctypes.c_uint16),
        ("adds", ctypes.c_ulonglong),
        ("subs", ctypes.c_ulonglong),
    ]


_LINKER_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(_LinkerInfo), ctypes.c_size_t, ctypes.c_void_p
)


class LoadedLibraries:
    """The shared libraries this process has mapped, with their stamps. /proc/self/maps is
    read again only when the dynamic linker's load or unload counter has moved (asked of
    dl_iterate_phdr, which stops at its first object); without those counters, every time.
    name: what a library's path is called in the result."""

    def __init__(self, name: Callable[[str], str] = str) -> None:
        self._name = name
        self._counts: tuple[int, int] | None = None
        self._stamps: dict[str, tuple[int, int] | None] = {}
        self._seen: tuple[int, int] | None = None
        self._ask = self._linker_asker()

    def _linker_asker(self) -> Callable[[], tuple[int, int] | None]:
        try:
            iterate = ctypes.CDLL(None).dl_iterate_phdr
        except (OSError, AttributeError):
            return lambda: None
        iterate.argtypes = [_LINKER_CALLBACK, ctypes.c_void_p]
        iterate.restype = ctypes.c_int

        def first(info: Any, size: int, data: object) -> int:
            if size >= _LinkerInfo.subs.offset + ctypes.sizeof(ctypes.c_ulonglong):
                self._seen = (info.contents.adds, info.contents.subs)
            return 1  # stop: the counters are the same in every object's info

        callback = _LINKER_CALLBACK(first)

        def ask() -> tuple[int, int] | None:
            self._seen = None
            iterate(callback, None)
            return self._seen

        return ask

    def stamps(self) -> dict[str, tuple[int, int] | None]:
        """Each mapped library's (size, mtime in ns), or None when its file is gone. The same
        dict object until the libraries change."""
        counts = self._ask()
        if counts is None or counts != self._counts:
            self._stamps = {
                self._name(path): library_stamp(path) for path in sorted(mapped_libraries())
            }
            self._counts = counts
        return self._stamps


def mapped_libraries(maps: Path = Path("/proc/self/maps")) -> set[str]:
    """Shared libraries this process has mapped (Linux); empty where /proc is not there."""
    try:
        text = maps.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    found = set()
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/"):
            name = os.path.basename(parts[5])
            if ".so" in name and not parts[5].endswith(" (deleted)"):
                found.add(parts[5])
    return found
