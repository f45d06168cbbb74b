"""devpool's own hooks run unwatched in a recording worker: they are the run's machinery.

Where devpool is its own project (its checkout's suite), devpool's code is project code. A
recording worker's plugins (the leak check around a wider fixture's setup, the worker's
report handling, the compat plugins) then run inside each test's window and would count
for every test: a change to any of them would select most of the suite. So each hook
implementation of devpool's plugins in this process runs with the watch off, as pytest's
own code goes unseen (pytest is outside the rootdir), and every other plugin's hook turns it
back on: pytest's runner and fixture hooks, which devpool's worker loop calls, run the test.
A hook wrapper is switched before and after its yield, not across it: what it wraps (a
fixture's setup, the test) runs as the hooks it wraps do. A test that calls devpool's code
itself, or runs devpool in a process of its own, is watched as before.

For any other project devpool lies outside the rootdir and nothing is wrapped.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator
from pathlib import Path
from types import ModuleType
from typing import Any

import pluggy
import pytest

PACKAGE = Path(__file__).resolve().parent.parent  # the devpool package running here
_WRAPPED = "__devpool_unwatched__"


def is_own(plugin: object) -> bool:
    """Whether a registered plugin is devpool's own (a module of it, or an object of one of
    its classes)."""
    name = plugin.__name__ if isinstance(plugin, ModuleType) else type(plugin).__module__
    return name == "devpool" or name.startswith("devpool.")


class OwnHooks:
    """Whether the hook running now is devpool's (unwatched) or another's (watched again:
    pytest's runner and fixture hooks, called from devpool's worker loop, run the test).

    `switch` is the recorder's: it turns the watch on or off while the recorder watches."""

    def __init__(self, switch: Callable[[bool], None]) -> None:
        self.stack: list[bool] = []  # each running hook: whether it is watched
        self._switch = switch

    def watching(self) -> bool:
        return self.stack[-1] if self.stack else True

    def enter(self, watched: bool) -> None:
        if watched != self.watching():
            self._switch(watched)
        self.stack.append(watched)

    def leave(self) -> None:
        before = self.stack.pop()
        if self.watching() != before:
            self._switch(self.watching())

    # ---- the plugins' hook implementations --------------------------------------------------

    def wrap_all(self, manager: pluggy.PluginManager) -> None:
        """Wrap the hooks of the plugins registered so far, and of those to come."""
        for plugin in manager.get_plugins():
            self.wrap(manager, plugin)
        manager.register(self, "devpool-own-hooks")

    @pytest.hookimpl(tryfirst=True)
    def pytest_plugin_registered(self, plugin: object, manager: pluggy.PluginManager) -> None:
        """A plugin registered later: wrapped before its other hooks run (the historic ones
        pluggy replays at its registration, pytest_configure, run before this: unwrapped)."""
        self.wrap(manager, plugin)

    def wrap(self, manager: pluggy.PluginManager, plugin: object) -> None:
        if plugin is self:
            return
        watched = not is_own(plugin)
        for caller in manager.get_hookcallers(plugin) or []:
            for impl in caller.get_hookimpls():
                if impl.plugin is plugin and not hasattr(impl.function, _WRAPPED):
                    step = self._steps if impl.wrapper or impl.hookwrapper else self._call
                    # pluggy calls impl.function with the arguments its own signature named
                    setattr(impl, "function", step(impl.function, watched))  # noqa: B010 - Final in pluggy's types

    def _call(self, function: Callable[..., Any], watched: bool) -> Callable[..., Any]:
        @functools.wraps(function)  # pluggy's messages name the plugin's function
        def switched(*args: Any) -> Any:
            __tracebackhide__ = True  # pytest's tracebacks show the hook, as without this
            self.enter(watched)
            try:
                return function(*args)
            finally:
                self.leave()

        setattr(switched, _WRAPPED, True)
        return switched

    def _steps(self, function: Callable[..., Any], watched: bool) -> Callable[..., Any]:
        """A hook wrapper whose every step (up to its yield, after it) runs so; what it
        wraps runs as the hooks it wraps do."""

        @functools.wraps(function)
        def switched(*args: Any) -> Generator[Any, Any, Any]:
            __tracebackhide__ = True
            inner = function(*args)
            sent: Any = None
            thrown: BaseException | None = None
            first = True
            while True:
                self.enter(watched)
                try:
                    if first:
                        first, value = False, next(inner)
                    elif thrown is not None:
                        value = inner.throw(thrown)
                    else:
                        value = inner.send(sent)
                except StopIteration as stop:
                    return stop.value
                finally:
                    self.leave()
                try:
                    sent, thrown = (yield value), None
                except GeneratorExit:
                    self.enter(watched)
                    try:
                        inner.close()
                    finally:
                        self.leave()
                    raise
                except BaseException as exc:  # noqa: BLE001 - handed to the wrapper, as pluggy does
                    sent, thrown = None, exc

        setattr(switched, _WRAPPED, True)
        return switched
