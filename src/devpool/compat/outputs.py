"""What a worker hands back when its session ends, for plugins whose state spans the run.

pytest-xdist calls it `config.workeroutput`: a dict the worker's plugins fill by the end of
pytest_sessionfinish, which the controller reads once that worker is gone. A devpool worker
has one of the same name and shape, so a plugin that only publishes there needs nothing
more. Nothing else of xdist's worker protocol is claimed (no `workerinput`): plugins that
see one switch to code paths that expect keys only xdist's controller fills. The adapters
in this package fill and read the dict for the plugins that need it (syrupy, benchmark).
"""

from __future__ import annotations

import base64
import pickle
from dataclasses import dataclass, field
from typing import Any

import pytest


@dataclass
class Outputs:
    """The controller's side: every worker's output, and who ended without sending one."""

    received: list[dict[str, Any]] = field(default_factory=list)
    senders: set[int] = field(default_factory=set)
    exited: set[int] = field(default_factory=set)

    @property
    def lost(self) -> int:
        """Workers that were ready for tests and ended without their output (a crash, a kill)."""
        return len(self.exited - self.senders)


_KEY = pytest.StashKey[Outputs]()


def of(config: pytest.Config) -> Outputs:
    return config.stash.setdefault(_KEY, Outputs())


def encode(output: dict[str, Any]) -> str:
    """Plugins put bytes and their own objects there (xdist's channel carries them): pickled."""
    return base64.b64encode(pickle.dumps(output)).decode("ascii")


def received(config: pytest.Config, pid: int, data: str) -> None:
    outputs = of(config)
    outputs.senders.add(pid)
    try:
        output = pickle.loads(base64.b64decode(data))  # noqa: S301 - our own worker's
    except (ValueError, pickle.UnpicklingError, AttributeError, ImportError, EOFError):
        outputs.senders.discard(pid)  # unreadable: as good as lost
        return
    if isinstance(output, dict) and output:
        outputs.received.append(output)


def exited(config: pytest.Config, pid: int) -> None:
    of(config).exited.add(pid)
