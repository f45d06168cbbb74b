"""Files a session writes at its end (JUnit XML, --lf/--nf state, HTML and JSON reports).

The controller writes them from the reports it replays, which cover the whole run; a worker
has seen only its share, so it writes none of them.
"""

from __future__ import annotations

import pytest

# Options of pytest and of common report plugins whose files only the controller writes,
# with the value that turns each off. A worker sets them before those plugins' own
# pytest_configure reads them (devpool's runs first: tryfirst, and registered after them).
_CONTROLLER_FILES: dict[str, object] = {
    "xmlpath": None,  # --junitxml
    "htmlpath": None,  # pytest-html
    "json_report": False,  # pytest-json-report
    "report_log": None,  # pytest-reportlog
    "pastebin": None,  # --pastebin
    "cacheclear": False,  # --cache-clear: the controller cleared it; a worker must not again
}

# cacheprovider's plugins that write --lf, --nf and --sw state when a session ends.
_CACHE_WRITERS = ("lfplugin", "nfplugin", "stepwiseplugin")


def configure_worker(config: pytest.Config) -> None:
    """Turn off, in a worker, the options that make plugins write session files."""
    for name, value in _CONTROLLER_FILES.items():
        if hasattr(config.option, name):
            setattr(config.option, name, value)


def quiet_worker(config: pytest.Config) -> None:
    """Unregister the plugins that would write --lf / --nf / --sw state at a worker's end.

    Tests keep the `cache` fixture: only pytest's own bookkeeping is the controller's.
    """
    for name in _CACHE_WRITERS:
        plugin = config.pluginmanager.get_plugin(name)
        if plugin is not None:
            config.pluginmanager.unregister(plugin)
