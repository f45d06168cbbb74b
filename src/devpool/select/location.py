"""Where a project's baselines live, as a run and the `devpool select` commands find them:
the fleet's PostgreSQL when the history (--devpool-history, else [tool.devpool] history) is
a postgresql:// URL, else <rootdir>/.devpool/select.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from devpool.config import check_tables, read_table
from devpool.folders import devpool_dir
from devpool.project import find_pyproject
from devpool.select.baseline import Store
from devpool.select.options import DEFAULT_KEEP, SelectOptions, select_options

if TYPE_CHECKING:
    from devpool.history.location import HistorySpec
    from devpool.select.store_pg import PgStore


def store_for(root: Path, keep: int = DEFAULT_KEEP) -> Store:
    """The project's baseline store: <rootdir>/.devpool/select."""
    return Store(devpool_dir(root) / "select", keep)


class Project:
    """The rootdir (the folder of the nearest pyproject.toml, else here), its [tool.devpool]
    table and selection options, and where its baselines are (the history: `history`, the
    command's --devpool-history, else [tool.devpool] history)."""

    def __init__(self, cwd: Path, history: str | None = None) -> None:
        from devpool.history.location import named_history

        pyproject = find_pyproject(cwd)
        self.root = pyproject.parent if pyproject is not None else cwd
        self.table = read_table(pyproject)
        check_tables(self.table, str(pyproject))  # every [tool.devpool…] table, as a run does
        self.options: SelectOptions = select_options(self.table, str(pyproject))
        text = history or self.table.get("history")
        spec = named_history(str(text), "--devpool-history") if text else None
        self.store = baseline_store(spec, self.root, self.options.keep)


def baseline_store(
    history: HistorySpec | None, root: Path, keep: int = DEFAULT_KEEP
) -> Store | PgStore:
    """The fleet's PostgreSQL beside its history when that is a postgresql:// URL, else the
    project's .devpool/select; each keeping the newest `keep` generations."""
    from devpool.history.location import HistoryUrl

    if isinstance(history, HistoryUrl):
        from devpool.select.store_pg import PgStore

        return PgStore(history.url, history.option, keep)
    return store_for(root, keep)
