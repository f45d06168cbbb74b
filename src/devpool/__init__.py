"""devpool: run pytest suites whose tests need accelerators on shared hosts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from devpool.select import below
from devpool.version import __version__

# Below a worker of a recording run, this process says what it runs (select/children.py).
if _recording := below.find():
    from devpool.select import children

    children.boot(_recording)


__all__ = ["__version__", "once"]

_Fixture = TypeVar("_Fixture")


def once(fixture: Any = None, /, **request: Any) -> Any:
    """Run a session fixture once per run, in a process of its own with a lease of its own,
    as `[tool.devpool.once]` names one (docs/once.md); under plain pytest, nothing changes:

        @devpool.once(device_count=1, ports=1)
        @pytest.fixture(scope="session")
        def model_server(): ...

    The request takes the keys of [tool.devpool.once]; `@devpool.once` alone asks for none.
    They are checked after collection, as the table's are."""
    from devpool.plan.once import declare

    mark: Callable[[_Fixture], _Fixture] = declare(request)
    return mark(fixture) if fixture is not None else mark
