"""pytest-randomly: one seed for the whole run, the controller's, honoured by every worker.

The controller's pytest-randomly resolves the seed (given, `last`, or new) and shows it in
the header; workers get it as --randomly-seed, so each test is seeded as in plain pytest
(pytest-randomly seeds every test from the seed and its node id, not from the order).
"""

from __future__ import annotations

import pytest


def worker_options(config: pytest.Config) -> list[str]:
    """--randomly-seed=N with the controller's seed, when pytest-randomly is active."""
    if not config.pluginmanager.has_plugin("randomly"):
        return []
    seed = getattr(config.option, "randomly_seed", None)
    if isinstance(seed, bool) or not isinstance(seed, int):
        return []
    return [f"--randomly-seed={seed}"]
