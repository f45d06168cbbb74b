"""What pytest's own report serialization leaves out, carried between worker and controller:
a subtest's parameters as pytest shows them, and a warning a test raised."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from _pytest._io.saferepr import saferepr

from devpool.worker.protocol import Warned

SUBTEST_CONTEXT = "_subtest.context"  # pytest's key for a subtest report's msg and kwargs


def shown_subtest_values(data: dict[str, Any]) -> None:
    """A subtest's parameters as pytest shows them (their repr), since JSON keeps only some
    types: the controller would show `n='-1'` for a value that was not a string."""
    context = data.get(SUBTEST_CONTEXT)
    if isinstance(context, dict) and isinstance(context.get("kwargs"), dict):
        context["kwargs"] = {key: saferepr(value) for key, value in context["kwargs"].items()}
        context["devpool_shown"] = True


class ReprOnly:
    """A value known only by its repr (a subtest parameter from a worker)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def restore_subtest_values(data: dict[str, Any]) -> None:
    """The controller's side of shown_subtest_values, before pytest rebuilds the report."""
    context = data.get(SUBTEST_CONTEXT)
    if isinstance(context, dict) and context.pop("devpool_shown", False):
        context["kwargs"] = {key: ReprOnly(str(text)) for key, text in context["kwargs"].items()}


def warned(
    message: warnings.WarningMessage,
    nodeid: str,
    location: Any,
    once: dict[str, Any] | None = None,
) -> Warned:
    """A warning a test raised, for the controller's warnings summary."""
    category = message.category
    return Warned(
        nodeid=nodeid,
        location=list(location) if location else None,
        message=str(message.message),
        category=f"{category.__module__}:{category.__qualname__}",
        filename=message.filename,
        lineno=message.lineno,
        line=message.line,
        once=once,
    )


def warning_from(event: Warned) -> warnings.WarningMessage:
    """The controller's copy of a worker's warning: its category where it can be imported
    (as the summary prints it), its text as the worker formatted it."""
    module, _, name = event.category.partition(":")
    category: type[Warning] = UserWarning
    try:
        found: Any = importlib.import_module(module)
        for part in name.split("."):
            found = getattr(found, part)
        if isinstance(found, type) and issubclass(found, Warning):
            category = found
    except (ImportError, AttributeError, ValueError):
        pass
    try:
        instance: Warning = category(event.message)
    except Exception:  # noqa: BLE001 - a category whose constructor wants other arguments
        instance = UserWarning(event.message)
    return warnings.WarningMessage(
        instance, category, event.filename, int(event.lineno or 0), line=event.line
    )
