"""The rank merge: n ranks' event streams become one, with one start, report and finish per test."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from devpool.select.baseline import union_deps
from devpool.select.record import DEPS_ATTR
from devpool.select.tables import expand
from devpool.worker import protocol


def _longrepr_text(data: Mapping[str, Any]) -> str:
    import pytest

    try:
        return str(pytest.TestReport._from_json(dict(data)).longreprtext)  # noqa: SLF001
    except Exception:  # noqa: BLE001 - an odd longrepr still gets shown as it is
        return json.dumps(data.get("longrepr"), default=str)


def _label(rank: int, text: str) -> str:
    return "\n".join(f"[rank {rank}] {line}" for line in (text.splitlines() or [""]))


def merge_phase(reports: Sequence[tuple[int, Mapping[str, Any]]]) -> dict[str, Any]:
    """One phase of one test across ranks: failed if any rank failed, passed only if all did."""
    failed = [(r, d) for r, d in reports if d.get("outcome") == "failed"]
    skipped = [(r, d) for r, d in reports if d.get("outcome") == "skipped"]
    base = dict((failed or skipped or list(reports))[0][1])
    base["duration"] = max(float(d.get("duration", 0.0)) for _, d in reports)
    if all("start" in d for _, d in reports):
        base["start"] = min(float(d["start"]) for _, d in reports)
        base["stop"] = max(float(d.get("stop", d["start"])) for _, d in reports)
    base["sections"] = [
        [f"{title} [rank {rank}]", content]
        for rank, data in reports
        for title, content in data.get("sections", [])
    ]
    if failed:
        base["outcome"] = "failed"
        base["longrepr"] = "\n".join(_label(r, _longrepr_text(d)) for r, d in failed)
    deps = _union_of_ranks(reports)
    if deps is not None:
        base[DEPS_ATTR] = deps
    return base


def _union_of_ranks(reports: Sequence[tuple[int, Mapping[str, Any]]]) -> dict[str, Any] | None:
    """--devpool-select record: a test depends on what any of its ranks ran or read."""
    seen = [
        expand(deps) if isinstance(deps, Mapping) else deps
        for deps in (data.get(DEPS_ATTR) for _, data in reports)
    ]
    if not any(isinstance(deps, Mapping) for deps in seen):
        return None
    nodeid = reports[0][1].get("nodeid")
    lacking = {"nodeid": nodeid, "recorded": False, "why": "a rank sent no dependencies"}
    return union_deps([deps if isinstance(deps, Mapping) else lacking for deps in seen])


class Merge:
    """n ranks' event streams → one stream with one start, report and finish per test."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.reports: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        self.finished: dict[str, set[int]] = {}
        self.started: set[str] = set()
        self.missing: set[str] = set()
        self.done: dict[int, dict[int, list[str]]] = {}

    def feed(self, rank: int, message: protocol.Message) -> list[protocol.Message]:
        if self.world == 1:
            return [message]
        event = message.get("ev")
        if event in ("ready", "warning", "renamed"):  # said once, as by one process
            return [message] if rank == 0 else []
        if event == "start":
            nodeid = message["nodeid"]
            if nodeid in self.started:
                return []
            self.started.add(nodeid)
            return [message]
        if event == "report":
            data = message["data"]
            self.reports.setdefault(data["nodeid"], []).append((rank, data))
            return []
        if event == "finish":
            nodeid = message["nodeid"]
            ranks = self.finished.setdefault(nodeid, set())
            ranks.add(rank)
            if len(ranks) < self.world:
                return []
            return [*self._merged(nodeid), message]
        if event == "missing":
            if message["nodeid"] in self.missing:
                return []
            self.missing.add(message["nodeid"])
            return [message]
        if event == "done":
            job = int(message["job"])
            ranks_done = self.done.setdefault(job, {})
            ranks_done[rank] = list(message.get("skipped", ()))
            if len(ranks_done) < self.world:
                return []
            skipped = sorted({n for names in ranks_done.values() for n in names})
            del self.done[job]
            return [{"ev": "done", "job": job, "skipped": skipped}]
        return []

    def _merged(self, nodeid: str) -> list[protocol.Message]:
        reports = sorted(self.reports.pop(nodeid, []), key=lambda rd: rd[0])
        self.started.discard(nodeid)
        self.finished.pop(nodeid, None)
        out: list[protocol.Message] = []
        for when in ("setup", "call", "teardown"):
            phase = [(r, d) for r, d in reports if d.get("when") == when]
            if not phase:
                continue
            merged = merge_phase(phase)
            out.append({"ev": "report", "data": merged})
            if when == "setup" and merged.get("outcome") != "passed":
                # pytest runs no call after a failed or skipped setup: nor does the merge.
                reports = [(r, d) for r, d in reports if d.get("when") != "call"]
        return out
