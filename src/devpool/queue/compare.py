"""What every job of a queue run must have collected alike, and the sentence when it did not.

Jobs whose collections differ only by what their platform deselects are the same run: every
job publishes every collected test, each with its class (queue/classes.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from devpool.wording import counted

SHOWN = 3  # node ids named in a sentence about a differing collection


@dataclass(frozen=True)
class QueuedTest:
    """One test as the run publishes it: its id, what it needs, and how long it should take."""

    test_id: str
    devices: int
    request: str  # the request in words, for sentences ("2 devices", "cpu")
    estimate: float
    chain: str = ""  # the first test of its pytest-order/-dependency chain (plan/chains.py)
    platforms: str = ""  # its class: the platforms it runs on, comma-joined ('' any)


def fingerprint(tests: Sequence[QueuedTest]) -> str:
    """What every job of a run must have collected alike: ids, device counts, classes and
    chains, in any order (pytest-randomly shuffles each job's own way; the first job's order
    is the run's). A class's chains only its own jobs see (fill_chains)."""
    text = "\n".join(
        sorted(f"{t.test_id}\t{t.devices}\t{t.platforms}\t{''if t.platforms else t.chain}"
               for t in tests)
    )  # fmt: skip
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def difference(
    published: Sequence[tuple[str, int]], mine: Sequence[QueuedTest], run_id: str, by: str
) -> str:
    """The sentence refusing a job whose collection differs from the published one."""
    theirs = dict(published)
    ours = {t.test_id: t.devices for t in mine}
    lacking = [t for t in theirs if t not in ours]
    extra = [t for t in ours if t not in theirs]
    needs = [
        f"{t} ({ours[t]} here, {theirs[t]} there)"
        for t in ours
        if theirs.get(t, ours[t]) != ours[t]
    ]
    parts = []
    for what, ids in (
        ("lacks {}", lacking),
        ("has {} the run does not", extra),
        ("needs other devices for {}", needs),
    ):
        if ids:
            named = ", ".join(ids[:SHOWN]) + (", …" if len(ids) > SHOWN else "")
            parts.append(what.format(counted(len(ids), "test")) + f" ({named})")
    if not parts:
        parts.append("ties its tests into other pytest-order or pytest-dependency chains")
    return (
        f"this job's collection differs from queue run {run_id!r} as {by} published it: it "
        + "; ".join(parts)
        + " (every job of a run must run the same commit with the same options)"
    )
