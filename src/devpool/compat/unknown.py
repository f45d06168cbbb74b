"""Plugins devpool has not met: the ones that may write files when a session ends.

Every worker is a pytest session of its own, so a plugin's pytest_sessionfinish runs in
each worker, over that worker's share of the tests, and again in the controller, which
ran none. Plugins devpool knows are handled (see the README's plugin table); any other
that implements the hook is named once at the end of the run, so that nothing it writes
is lost or halved in silence.
"""

from __future__ import annotations

from pathlib import Path

import pytest

# Distributions (or top-level modules) whose pytest_sessionfinish devpool handles or has
# checked: their session files are the controller's alone, or they write nothing.
KNOWN = frozenset(
    {
        "_pytest",
        "pytest",
        "devpool",
        "pytest_cov",
        "pytest-cov",
        "syrupy",
        "pytest_benchmark",
        "pytest-benchmark",
        "pytest_html",
        "pytest-html",
        "pytest_jsonreport",
        "pytest-json-report",
        "pytest_reportlog",
        "pytest-reportlog",
        "xdist",
        "pytest-xdist",
        "pytest_rerunfailures",
        "pytest-rerunfailures",
        "pytest_timeout",
        "pytest-timeout",
        "hypothesis",
        "_hypothesis_pytestplugin",
        "pytest_randomly",
        "pytest-randomly",
        "pytest_asyncio",
        "pytest-asyncio",
        "pytest_order",
        "pytest-order",
        "pytest_dependency",
        "pytest-dependency",
        "pytest_mock",
        "pytest-mock",
    }
)


def _module_of(plugin: object) -> str:
    name = getattr(plugin, "__name__", None)
    if not isinstance(name, str):
        name = type(plugin).__module__
    return name


def unknown_session_writers(config: pytest.Config) -> list[str]:
    """Plugins (and conftest files) outside KNOWN with a pytest_sessionfinish of their own."""
    dists = {id(plugin): dist for plugin, dist in config.pluginmanager.list_plugin_distinfo()}
    found: list[str] = []
    for impl in config.hook.pytest_sessionfinish.get_hookimpls():
        plugin = impl.plugin
        module = _module_of(plugin)
        dist = dists.get(id(plugin))
        project = dist.project_name if dist is not None else None
        if project in KNOWN or module.split(".")[0] in KNOWN:
            continue
        if module.endswith("conftest") and hasattr(plugin, "__file__"):
            path = Path(plugin.__file__)
            found.append(
                str(
                    path.relative_to(config.rootpath)
                    if path.is_relative_to(config.rootpath)
                    else path
                )
            )
        else:
            found.append(project or module)
    return sorted(set(found))


def summary_line(config: pytest.Config) -> str | None:
    names = unknown_session_writers(config)
    if not names:
        return None
    listed = ", ".join(names)
    return (
        f"devpool: pytest_sessionfinish of {listed} ran in every worker with only that "
        "worker's tests, and in the controller with none run: check what it writes at the "
        "end of a session (README, Plugins)"
    )
