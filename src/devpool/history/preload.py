"""What each kind of worker imports while its tests run, so its template imports it first.

A worker forked from a template shares what the template imported while collecting. What the
tests import lazily (torch's optimiser brings in torch._dynamo, sympy and mpmath: about 800
modules and a second of CPU) every forked worker imports again, and under `isolation = job`
every test does: plain pytest pays it once. So each worker tells the controller which
library modules its tests imported (not the project's own: only files outside the rootdir,
or in a site-packages folder), leaving out what a test imported while it raised a warning
(the template would swallow it, and the test would then not see it). The controller keeps
them per kind beside the duration history, and the next run's templates import them after
collecting, before they fork: as Android's zygote preloads the classes apps use.

A module that fails to import is skipped. A template that is not safe to fork after its
preload (a module started a thread) says so as any unsafe template does. A module after
whose import the template ran more threads is never preloaded again (the file's `never`
list); a template unsafe for another reason drops its kind's list.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from devpool.folders import made

PRELOAD_ENV = "DEVPOOL_PRELOAD"  # the file, in a template's environment
FORMAT = "devpool-preload"
MOST = 5000  # modules kept per kind


def preload_path(history: Path) -> Path:
    """Beside the history: .devpool/history.preload.json for the default one."""
    return history.with_name(f"{history.stem}.preload.json")


def _lists(data: dict[str, Any], key: str) -> dict[str, list[str]]:
    lists = data.get(key)
    if not isinstance(lists, dict):
        return {}
    return {
        str(k): [m for m in v if isinstance(m, str)]
        for k, v in lists.items()
        if isinstance(v, list)
    }


def _read(path: Path) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(kind → modules to preload, kind → modules never to preload); empty for a missing or
    foreign file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}, {}
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return {}, {}
    return _lists(data, "kinds"), _lists(data, "never")


def modules_of(path: Path, size: int) -> list[str]:
    """The modules a kind's workers imported in the last run that ran it ([] if none)."""
    return _read(path)[0].get(str(size), [])


def write(
    path: Path,
    seen: Mapping[int, Iterable[str]],
    dropped: Iterable[int] = (),
    never: Mapping[int, Iterable[str]] | None = None,
) -> None:
    """Keep what this run's workers imported, kind by kind (kinds it did not run keep their
    lists; dropped kinds lose theirs; a kind's `never` modules are left out for good).
    Written whole and renamed: a reader never sees half a file."""
    kinds, refused = _read(path)
    for size, modules in (never or {}).items():
        refused[str(size)] = list(dict.fromkeys([*refused.get(str(size), []), *modules]))
    for size, modules in seen.items():
        kinds[str(size)] = list(dict.fromkeys(modules))[:MOST]
    for size in dropped:
        kinds.pop(str(size), None)
    for kind, modules in kinds.items():
        left_out = set(refused.get(kind, ()))
        kinds[kind] = [m for m in modules if m not in left_out]
    partial = path.with_name(f".{path.name}.{os.getpid()}.part")
    text = json.dumps({"format": FORMAT, "kinds": kinds, "never": refused})
    try:
        made(path.parent)
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
    except OSError:
        partial.unlink(missing_ok=True)  # a read-only project: the next run imports as before


def libraries(names: Iterable[str], rootpath: Path) -> list[str]:
    """The names, in order, of modules loaded from a file outside the project (rootpath),
    or from a site-packages folder inside it (a virtual environment in the project)."""
    root = str(rootpath) + os.sep
    found = []
    for name in names:
        module = sys.modules.get(name)
        origin = getattr(module, "__file__", None)
        if not isinstance(origin, str) or name == "__main__":
            continue
        if not origin.startswith(root) or f"{os.sep}site-packages{os.sep}" in origin:
            found.append(name)
    return found
