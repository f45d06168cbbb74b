"""select/own_hooks.py through a real pluggy PluginManager: devpool's own hook
implementations run unwatched, other plugins' watched again, a wrapper's steps apart from
what it wraps, and results and exceptions pass through unchanged."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pluggy
import pytest
from _pytest.config import PytestPluginManager

from devpool.select.own_hooks import OwnHooks, is_own

spec = pluggy.HookspecMarker("pytest")
impl = pytest.hookimpl


class Specs:
    @spec(firstresult=True)
    def pytest_t_run(self, seen: list[Any]) -> Any: ...  # type: ignore[empty-body]


class Theirs:
    """Another plugin's hook: it runs 'the test' (watched)."""

    def __init__(self, owner: OwnHooks, fail: bool = False) -> None:
        self.owner, self.fail = owner, fail

    @impl
    def pytest_t_run(self, seen: list[Any]) -> Any:
        seen.append(("test", self.owner.watching()))
        if self.fail:
            raise KeyError("from the test")
        return "result"


class Ours:
    """devpool's: a wrapper around the test and a loop that runs it through the hook."""

    def __init__(self, owner: OwnHooks) -> None:
        self.owner = owner

    @impl(wrapper=True)
    def pytest_t_run(self, seen: list[Any]) -> Generator[None, Any, Any]:
        seen.append(("before", self.owner.watching()))
        try:
            result = yield
        except KeyError as exc:
            seen.append(("caught", self.owner.watching()))
            raise ValueError("wrapped") from exc
        seen.append(("after", self.owner.watching()))
        return f"{result}!"


Ours.__module__ = "devpool.worker.fake"  # as a class of devpool's would be


def manager(owner: OwnHooks, *plugins: object) -> pluggy.PluginManager:
    """pytest's own plugin manager (it takes OwnHooks' unmarked pytest_plugin_registered)."""
    pm = PytestPluginManager()
    pm.add_hookspecs(Specs)
    for plugin in plugins:
        pm.register(plugin)
    owner.wrap_all(pm)
    return pm


def test_devpools_hooks_are_unwatched_and_what_they_wrap_is_watched() -> None:
    switches: list[bool] = []
    owner = OwnHooks(switches.append)
    pm = manager(owner, Theirs(owner), Ours(owner))
    seen: list[Any] = []
    assert pm.hook.pytest_t_run(seen=seen) == "result!"
    assert seen == [("before", False), ("test", True), ("after", False)]
    assert switches == [False, True, False, True]  # off for each step of the wrapper only
    assert owner.stack == []


def test_an_exception_reaches_the_wrapper_and_leaves_the_watch_as_it_was() -> None:
    switches: list[bool] = []
    owner = OwnHooks(switches.append)
    pm = manager(owner, Theirs(owner, fail=True), Ours(owner))
    seen: list[Any] = []
    with pytest.raises(ValueError, match="wrapped") as raised:
        pm.hook.pytest_t_run(seen=seen)
    assert isinstance(raised.value.__cause__, KeyError)
    assert seen == [("before", False), ("test", True), ("caught", False)]
    assert switches[-1] is True and owner.stack == []


def test_a_plugin_registered_later_is_wrapped_too_and_only_once() -> None:
    switches: list[bool] = []
    owner = OwnHooks(switches.append)
    pm = manager(owner, Theirs(owner))
    ours = Ours(owner)
    pm.register(ours)  # wrapped by pytest_plugin_registered
    seen: list[Any] = []
    assert pm.hook.pytest_t_run(seen=seen) == "result!"
    assert seen == [("before", False), ("test", True), ("after", False)]
    owner.wrap(pm, ours)  # again: left as it is, not wrapped twice
    seen.clear()
    switches.clear()
    pm.hook.pytest_t_run(seen=seen)
    assert switches == [False, True, False, True]


def test_only_devpools_modules_and_objects_are_its_own() -> None:
    import devpool.plugin

    assert is_own(devpool.plugin) and is_own(Ours.__new__(Ours))
    assert not is_own(pytest) and not is_own(Theirs.__new__(Theirs))
