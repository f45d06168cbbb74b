"""The controller collects the suite without pytest's assertion rewriting.

The controller imports every test module to collect it but runs no test: the workers
import, rewrite and run them. Rewriting in the controller too (parsing and compiling each
module's AST again) was about a third of its CPU on a real suite, on the serial path
before any test starts; pytest-xdist's controller does not import the suite at all. The
rewriting hook is set aside while this process collects and put back afterwards (an
in-process pytester session shares sys.meta_path with the session around it). The
conftests pytest loads before collecting, and what they import, are rewritten as pytest
rewrites them: a template forked from this process just before it collects
(backends/controller_fork.py) has them as a worker would.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from devpool.config import read_table


def is_controller(config: pytest.Config, args: list[str]) -> bool:
    """Whether this process will be devpool's controller: --devices, or `devices` in
    [tool.devpool], and not a worker."""
    if any(a == "--devpool-worker" or a.startswith("--devpool-worker=") for a in args):
        return False
    if getattr(config.known_args_namespace, "devpool_devices", None):
        return True
    inipath = config.inipath
    if inipath is None or inipath.name != "pyproject.toml":
        return False
    try:
        return "devices" in read_table(inipath)
    except Exception:  # noqa: BLE001 - the controller reports a broken table itself
        return False


class PlainCollection:
    """Holds pytest's rewriting hook out of sys.meta_path, and puts it back."""

    def __init__(self) -> None:
        self.hooks: list[tuple[int, Any]] = []

    def start(self) -> None:
        from _pytest.assertion.rewrite import AssertionRewritingHook

        self.hooks = [
            (index, finder)
            for index, finder in enumerate(sys.meta_path)
            if isinstance(finder, AssertionRewritingHook)
        ]
        for _, finder in self.hooks:
            sys.meta_path.remove(finder)

    def stop(self) -> None:
        for index, finder in self.hooks:
            if finder not in sys.meta_path:
                sys.meta_path.insert(index, finder)
        self.hooks = []
