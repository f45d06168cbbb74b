"""--devpool-queue: this session as one job of a run that many CI jobs share.

It publishes the run's tests (or checks them against those published) and joins; its plan's
jobs then come from its claims, and tests that no job can hold are the queue's to end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import pytest

from devpool.backends import Backend
from devpool.config import Settings
from devpool.devices.inventory import Inventory
from devpool.errors import DevpoolError
from devpool.history.location import HistorySpec
from devpool.plan.jobs import Plan
from devpool.session import past_runs

if TYPE_CHECKING:
    from devpool.queue.source import QueueSource


class Joining(Protocol):
    """What joining the queue needs from the controller, and where the source then goes."""

    config: pytest.Config
    settings: Settings
    inventory: Inventory
    host: str
    max_parallel: int
    asked: dict[str, int]
    classes: dict[str, tuple[str, ...]]
    history_path: HistorySpec
    quarantine_notes: list[str]
    estimates: dict[str, float]
    listeners: list[Any]


def join(ctx: Joining, plan: Plan, backend: Backend) -> QueueSource:
    """Publish or check the run's tests and join the queue: the source follows the run as a
    listener and a plugin. A queue that cannot be joined is a pytest.UsageError."""
    from devpool.queue.source import join_queue

    try:
        default, notes = ctx.settings.default_estimate, ctx.quarantine_notes
        of = past_runs.class_estimates(ctx.history_path, notes, ctx.estimates, default)
        source = join_queue(
            ctx.settings, plan, ctx.inventory, ctx.host, ctx.max_parallel, ctx.asked,
            ctx.classes, of,
        )  # fmt: skip
    except DevpoolError as exc:
        backend.close()
        raise pytest.UsageError(str(exc)) from None
    plan.unsatisfiable = []
    ctx.listeners.append(source)
    ctx.config.pluginmanager.register(source, "devpool-queue")
    terminal = ctx.config.pluginmanager.get_plugin("terminalreporter")
    if terminal is not None:
        for line in [source.joined, *source.notes]:
            terminal.write_line(f"devpool: {line}")
    return source
