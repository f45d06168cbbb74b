"""What a worker collects and runs: the controller's rootdir, inifile and final selection.

A worker is a fresh `python -m pytest` with the controller's arguments. Two things must
not be derived again in it, because they can come out differently there:

- the rootdir and inifile: pytest guesses them from the arguments before plugin options
  are known, so the value of `--devpool-lock-dir /new/folder` counts as a path once the
  folder exists. Workers get `--rootdir` and `-c` pinned, and option values glued to
  their options (`--devpool-lock-dir=/new/folder`);
- the selection: conftests may deselect by position (`items[K::N]`), which gives another
  answer over a worker's smaller collection. Workers keep exactly the node ids in the
  file named by DEVPOOL_NODEIDS, after every other collection hook.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import pytest

NODEIDS_ENV = "DEVPOOL_NODEIDS"  # a file of the controller's selected node ids, one a line


def worker_args(config: pytest.Config) -> list[str]:
    """The pytest arguments a worker starts with (before its --devpool-worker flag)."""
    cwd = config.invocation_params.dir
    pinned = ["--rootdir", _relative(config.rootpath, cwd)]
    if config.inipath is not None:
        pinned += ["-c", _relative(config.inipath, cwd)]
    args = glue_option_values(config.invocation_params.args, _value_options(config))
    # Pinned first: a --rootdir or -c the user gave comes later and wins, as it did here.
    return [*pinned, *args]


def _relative(path: Path, cwd: Path) -> str:
    """Relative to the invocation folder: a Ray node with shipped code has another root."""
    return os.path.relpath(path, cwd)


def _value_options(config: pytest.Config) -> set[str]:
    """Long options, of pytest and of every plugin and conftest, that take exactly one value."""
    parser: argparse.ArgumentParser | None = getattr(config._parser, "optparser", None)  # noqa: SLF001
    actions: Mapping[str, argparse.Action] = getattr(parser, "_option_string_actions", {})
    return {
        name
        for name, action in actions.items()
        if name.startswith("--") and action.nargs in (None, "?") and _takes_value(action)
    }


def _takes_value(action: argparse.Action) -> bool:
    # store_true, count, help, version ... take no value: their nargs is 0.
    return action.nargs != 0 and not isinstance(
        action,
        (
            argparse._StoreConstAction,  # noqa: SLF001 - also store_true / store_false
            argparse._CountAction,  # noqa: SLF001
            argparse._HelpAction,  # noqa: SLF001
            argparse._VersionAction,  # noqa: SLF001
        ),
    )


def glue_option_values(args: Sequence[str], value_options: Iterable[str]) -> list[str]:
    """`--opt value` → `--opt=value` for the given options, up to a `--`.

    pytest reads the arguments once before plugins and conftests add their options; a
    value that is an existing folder then counts as a test path and moves the rootdir."""
    known = set(value_options)
    out: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "--":
            out.extend(args[index:])
            break
        following = args[index + 1] if index + 1 < len(args) else None
        if arg in known and following is not None and not following.startswith("-"):
            out.append(f"{arg}={following}")
            index += 2
            continue
        out.append(arg)
        index += 1
    return out


def place(item: pytest.Item) -> str | None:
    """Where a parametrized item stands (module, class, function, parameter indices), which
    holds when its ids do not: ids built at collection from the clock, a seed or a temporary
    path differ between two collections. None for an item that is not parametrized."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    name = getattr(item, "originalname", item.name)
    parent = item.nodeid[: len(item.nodeid) - len(item.name)]
    indices = ",".join(f"{arg}={index}" for arg, index in sorted(callspec.indices.items()))
    return f"{parent}{name}[{indices}]"


class ChosenNodeids:
    """The controller's selected node ids, and the place of each parametrized one."""

    def __init__(self, nodeids: Iterable[str], places: Mapping[str, str] | None = None) -> None:
        self.nodeids = set(nodeids)
        self.places = dict(places or {})  # node id → place
        self.at = {where: nodeid for nodeid, where in self.places.items()}  # place → node id

    def __contains__(self, nodeid: object) -> bool:
        return nodeid in self.nodeids

    def place_of(self, nodeid: str) -> str | None:
        return self.places.get(nodeid)


def write_selection(items: Iterable[pytest.Item], folder: Path) -> Path:
    """Write the controller's final selection for the workers; returns the file.

    One line per item: its node id, and for a parametrized item a tab and its place (node
    ids escape control characters, so a tab never appears in one)."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "selected.txt"
    lines = []
    for item in items:
        where = place(item)
        lines.append(f"{item.nodeid}\t{where}\n" if where else f"{item.nodeid}\n")
    target.write_text("".join(lines), encoding="utf-8")
    return target


def read_selection(path: Path) -> ChosenNodeids:
    """The node ids a worker may run (the file write_selection wrote)."""
    nodeids: list[str] = []
    places: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").split("\n"):
        if not line:
            continue
        nodeid, _, where = line.partition("\t")
        nodeids.append(nodeid)
        if where:
            places[nodeid] = where
    return ChosenNodeids(nodeids, places)


def restrict(
    collected: Sequence[pytest.Item], items: Sequence[pytest.Item], selected: ChosenNodeids
) -> list[pytest.Item]:
    """The selected items in collection order, whatever other hooks kept of them.

    collected is every item before collection hooks ran; items what they left (a hook
    may also add items, which count when selected). An item whose id differs from the
    controller's is kept when it stands at a selected item's place that no item here has."""
    seen: set[str] = set()
    kept: list[pytest.Item] = []
    everything = [*collected, *items]
    present = {item.nodeid for item in everything}
    for item in everything:
        if item.nodeid in seen:
            continue
        if item.nodeid not in selected:
            where = place(item) if selected.at else None
            owner = selected.at.get(where) if where is not None else None
            if owner is None or owner in present:
                continue
        seen.add(item.nodeid)
        kept.append(item)
    return kept


class Worklist:
    """What this worker may run: the test modules it collects, the controller's selection
    kept over what it collected, and the node ids it runs under another name."""

    def __init__(self, modules_file: str | None, selected_from: str | None) -> None:
        self.modules: set[str] | None = None  # None: every module
        if modules_file:
            self.modules = set(Path(modules_file).read_text(encoding="utf-8").split("\n")) - {""}
        # The file of the controller's selection (None: keep what this process's collection
        # keeps), and what it holds.
        self.selected_from = selected_from
        self.selected = _selection(selected_from)
        self.collected: list[pytest.Item] = []  # every item, before any collection hook
        self.renamed: dict[str, str] = {}  # this process's node id → the controller's

    def ignores(self, collection_path: Path) -> bool | None:
        """Skip test modules that hold none of this worker's jobs: no import, no collection."""
        if self.modules is None or collection_path.suffix != ".py":
            return None
        if collection_path.name in ("conftest.py", "__init__.py"):
            return None
        return True if str(collection_path) not in self.modules else None

    def select(self, session: pytest.Session, path: str | None) -> None:
        """Keep the selection in the file at path, over the same collection (see
        keep_selected); nothing to do when this process kept it already.

        A template started while the controller was still collecting had no selection yet:
        it applies the one its first fork request names before it forks (ForkServer.serve's
        prepare), so its children do not each read the file and walk every item again."""
        if path == self.selected_from:
            return
        self.selected_from = path
        self.selected = _selection(path)
        if self.selected is not None:
            session.items[:] = restrict(self.collected, session.items, self.selected)

    def keep_selected(self, session: pytest.Session) -> None:
        """The controller's selection is final: keep exactly its node ids."""
        if self.selected is not None:
            session.items[:] = restrict(self.collected, session.items, self.selected)

    def by_place(self, items: dict[str, pytest.Item], nodeid: str) -> pytest.Item | None:
        """The item at the controller's item's place, when their parametrize ids differ (ids
        built from the clock, a seed or a temporary path at collection); it is renamed."""
        if self.selected is None:
            return None
        where = self.selected.place_of(nodeid)
        if where is None:
            return None
        for item in items.values():
            if item.nodeid not in self.selected and place(item) == where:
                self.renamed[item.nodeid] = nodeid
                return item
        return None


def _selection(path: str | None) -> ChosenNodeids | None:
    """The controller's selected node ids (the file DEVPOOL_NODEIDS names), None when not
    given."""
    if not path:
        return None
    try:
        return read_selection(Path(path))
    except OSError as exc:  # e.g. a Ray node with shipped code cannot see the controller's file
        print(f"devpool worker: runs without the controller's selection: {exc}", file=sys.stderr)
        return None
