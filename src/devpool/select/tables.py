"""The parts of a test's dependencies that its worker shares with its other tests, sent once.

Every test of a worker depends on the same shared libraries and, mostly, the same shared
spots (the top level of each project module loaded, code run at import). Sent with every
teardown report they were most of its bytes. A worker names each such table by a digest of
its content and sends the content with the first report that names it; the controller keeps
tables by digest, for the whole run, and puts them back into each test's dependencies
(`expand`) before anything reads them. By content, not by worker: a table is the same
whichever worker, rank or attempt sent it. A name whose content never arrived makes the
test unrecorded (it always runs), never recorded with less.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

# deps key of the table → where its content goes back in the deps
KINDS = {"shared_spots": "spots", "libs": "libs"}
_TABLES: dict[str, Any] = {}  # the controller's: digest → content


class SentTables:
    """The worker's side: a digest per table object, and the digests already sent."""

    def __init__(self) -> None:
        self._digests: dict[str, tuple[object, str]] = {}  # kind → (table, its digest)
        self._sent: set[str] = set()

    def refer(self, kind: str, table: Mapping[str, Any] | list[Any]) -> dict[str, Any]:
        """The deps fields for one table: its digest, and its content the first time."""
        known = self._digests.get(kind)
        if known is None or known[0] is not table:  # tables are replaced, never changed
            text = json.dumps(table, sort_keys=True, separators=(",", ":"))
            known = self._digests[kind] = (table, hashlib.sha256(text.encode()).hexdigest()[:24])
        digest = known[1]
        fields: dict[str, Any] = {f"{kind}_id": digest}
        if digest not in self._sent:
            self._sent.add(digest)
            fields[kind] = table
        return fields


def expand(deps: Mapping[str, Any]) -> dict[str, Any]:
    """One test's deps with its tables put back (the controller's side); idempotent."""
    full = dict(deps)
    for kind, into in KINDS.items():
        digest = full.pop(f"{kind}_id", None)
        if digest is None:
            continue
        table = full.pop(kind, None)
        if table is not None:
            _TABLES[digest] = table
        table = _TABLES.get(digest)
        if table is None:
            full["recorded"] = False
            full["why"] = full.get("why") or f"its worker's {kind} table never arrived"
            continue
        full[into] = [*table, *full.get(into, [])] if into == "spots" else dict(table)
    return full
