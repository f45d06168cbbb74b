"""The rank merge: n ranks' event streams become one, with one start, report and finish per test.

One module for both kinds of multi-rank test: `ranks(n)` on a host (backends/ranks.py) and
`nodes(n)` on Ray (ray/backend.py). A phase passes only if every rank passed it, is skipped
only if every rank skipped it (a skip on some ranks only fails, naming them), and fails with
each failed rank's traceback labelled `[rank N]`; captured output comes in sections per rank.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
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
    """One phase of one test across ranks: failed if any rank failed, passed only if all
    did, skipped only if all did (a skip on some ranks only is a failure naming them)."""
    failed = [(r, d) for r, d in reports if d.get("outcome") == "failed"]
    # A rank's own failure first (its line is the test's one-line reason), ranks that devpool
    # ended for it after.
    failed.sort(key=lambda rd: str(rd[1].get("longrepr", "")).startswith(ENDED))
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
    own = [(r, d) for r, d in failed if not str(d.get("longrepr", "")).startswith(ENDED)]
    if own:
        base["outcome"] = "failed"
        first, data = own[0]
        crash = data.get("longrepr")
        crash = crash.get("reprcrash") if isinstance(crash, Mapping) else None
        # pytest's one-line views (short summary, --tb=line) show a text longrepr's first line.
        head = f"rank {first}: {crash['message']}\n" if isinstance(crash, Mapping) else ""
        base["longrepr"] = head + "\n".join(_label(r, _longrepr_text(d)) for r, d in failed)
    elif skipped and len(skipped) < len(reports):
        # Some ranks skipped and the others ran on (or were ended waiting for them).
        ran = sorted(r for r, d in reports if d.get("outcome") != "skipped")
        raw = skipped[0][1].get("longrepr")
        if isinstance(raw, (list, tuple)) and len(raw) == 3:
            reason = str(raw[2])  # (path, line, "Skipped: why"), as pytest keeps a skip
        else:
            reason = _longrepr_text(skipped[0][1])
        base["outcome"] = "failed"
        base["longrepr"] = "\n".join(
            [
                f"skipped on {ranks_named(r for r, _ in skipped)} only, ran on "
                f"{ranks_named(ran)}: a distributed test skips on every rank or on none",
                _label(skipped[0][0], reason),
                *(_label(r, _longrepr_text(d)) for r, d in failed),
            ]
        )
    elif failed:
        base["outcome"] = "failed"
        base["longrepr"] = "\n".join(_label(r, _longrepr_text(d)) for r, d in failed)
    deps = _union_of_ranks(reports)
    if deps is not None:
        base[DEPS_ATTR] = deps
    return base


def ranks_named(ranks: Iterable[int]) -> str:
    """'rank 1', 'ranks 0, 2': ranks as the merged reports name them."""
    listed = sorted(ranks)
    word = "rank" if len(listed) == 1 else "ranks"
    return f"{word} {', '.join(map(str, listed))}"


_PHASES = {"setup": 0, "call": 1, "teardown": 2}

ENDED = "ended: "  # the part of a rank devpool ended because another rank's ending doomed it


def ended_report(nodeid: str, location: Sequence[Any], when: str, why: str) -> dict[str, Any]:
    """A rank's phase that devpool ended (another rank failed first): failed, saying why
    (why starts with ENDED)."""
    return {
        "$report_type": "TestReport",
        "nodeid": nodeid,
        "location": list(location),
        "keywords": {},
        "outcome": "failed",
        "longrepr": why,
        "when": when,
        "user_properties": [],
        "sections": [],
        "duration": 0.0,
    }


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
    """n ranks' event streams → one stream with one start, report and finish per test.

    A test's start goes out when its first rank starts it, never before the test ahead of it
    has finished on every rank; its reports and finish when its last rank finishes it (or
    was ended: end_rank)."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.reports: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        self.finished: dict[str, set[int]] = {}
        self.started: set[str] = set()
        self.starts: dict[str, protocol.Start] = {}  # each open test's first start
        self.current: str | None = None  # the test whose start went out, not yet finished
        self.held: list[protocol.Start] = []  # starts of tests behind the current one
        self.where: dict[int, str] = {}  # rank → the test it runs now
        self.ready: set[int] = set()
        self.gone: set[int] = set()  # ranks that will say nothing more
        self.missing: set[str] = set()
        self.done: dict[int, dict[int, list[str]]] = {}
        # --setup-show's text of rank 0, per open test: (rank 0's reports before it, text).
        self.shown: dict[str, list[tuple[int, protocol.Shown]]] = {}
        # Ranks at a debugger's prompt, in turn: the first holds the terminal, the others
        # wait (the loop lends one worker's terminal at a time).
        self.prompts: list[tuple[int, protocol.Debugger]] = []

    def feed(self, rank: int, message: protocol.Message) -> list[protocol.Message]:
        if self.world == 1:
            return [message]
        if isinstance(message, protocol.Ready):  # once every rank is: the test runs on all
            self.ready.add(rank)
            return [message] if len(self.ready) == self.world else []
        if isinstance(message, (protocol.Warned, protocol.Renamed, protocol.Imported)):
            return [message] if rank == 0 else []  # once, as by one process
        if isinstance(message, protocol.Output):
            return [message] if rank == 0 else []
        if isinstance(message, protocol.Leak):
            return [message]  # each rank's own leftovers: a ranks(n) test counts them all
        if isinstance(message, (protocol.OnceUp, protocol.OnceDown)):
            return [message]  # a once-fixture's process is never a rank: passed on as said
        if isinstance(message, protocol.Shown):
            return self._shown(rank, message)
        if isinstance(message, protocol.Debugger):
            self.prompts.append((rank, message))
            return [message] if len(self.prompts) == 1 else []
        if isinstance(message, protocol.DebuggerLeft):
            return self._left_prompt(rank, message)
        if isinstance(message, protocol.Quit):
            return [message]  # any rank's pytest.exit() or `q` ends the run
        if isinstance(message, protocol.Start):
            nodeid = message.nodeid
            self.where[rank] = nodeid
            if nodeid in self.started:
                return []
            self.started.add(nodeid)
            self.starts[nodeid] = message
            if self.current is not None:
                self.held.append(message)
                return []
            self.current = nodeid
            return [message]
        if isinstance(message, protocol.Report):
            data = message.data
            self.reports.setdefault(data["nodeid"], []).append((rank, data))
            return []
        if isinstance(message, protocol.Finish):
            nodeid = message.nodeid
            self.where.pop(rank, None)
            ranks = self.finished.setdefault(nodeid, set())
            ranks.add(rank)
            return self._complete(nodeid, message)
        if isinstance(message, protocol.Missing):
            if message.nodeid in self.missing:
                return []
            self.missing.add(message.nodeid)
            return [message]
        if isinstance(message, protocol.Done):
            job = message.job
            ranks_done = self.done.setdefault(job, {})
            ranks_done[rank] = list(message.skipped)
            if len(ranks_done) < self.world:
                return []
            skipped = sorted({n for names in ranks_done.values() for n in names})
            del self.done[job]
            return [protocol.Done(job=job, skipped=skipped)]
        raise protocol.ProtocolError(f"the rank merge has no rule for {message!r:.200}")

    def _shown(self, rank: int, message: protocol.Shown) -> list[protocol.Message]:
        """--setup-show's lines once, as one process writes them: rank 0's, among the merged
        reports where rank 0 wrote them (after its test: the widest fixtures' teardown)."""
        if rank != 0:
            return []
        nodeid = self.where.get(0)
        if nodeid is None or nodeid not in self.started:
            return [message]
        before = sum(1 for r, _ in self.reports.get(nodeid, []) if r == 0)
        self.shown.setdefault(nodeid, []).append((before, message))
        return []

    def _left_prompt(self, rank: int, left: protocol.DebuggerLeft) -> list[protocol.Message]:
        """A rank left the debugger: the next rank waiting for the terminal gets it."""
        if not self.prompts or self.prompts[0][0] != rank:
            self.prompts = [(r, m) for r, m in self.prompts if r != rank]
            return []
        self.prompts.pop(0)
        return [left, *(m for _, m in self.prompts[:1])]

    def phases(self, nodeid: str, rank: int) -> set[str]:
        """The phases of a test this rank has reported."""
        return {d.get("when", "") for r, d in self.reports.get(nodeid, []) if r == rank}

    def end_rank(self, rank: int, why: str) -> list[protocol.Message]:
        """A rank devpool ended while others ran on: its part of the test it was in (or the
        current test, which it had not reached) fails with why; what completes goes out."""
        self.gone.add(rank)
        prompt = [m for r, m in self.prompts if r == rank]
        out = self._left_prompt(rank, protocol.DebuggerLeft(pid=prompt[0].pid)) if prompt else []
        nodeid = self.where.pop(rank, None) or self.current
        if nodeid is None or rank in self.finished.get(nodeid, set()):
            return out
        start = self.starts.get(nodeid)
        location = start.location if start is not None else [nodeid, None, nodeid]
        seen = self.phases(nodeid, rank)
        # A rank still in its setup when another's body ended the test (a slow rank on a
        # loaded host): its part is of the body too, else the merged setup would fail and
        # drop the call reports that name the rank that failed.
        body_ran = any(
            d.get("when") == "call" for r, d in self.reports.get(nodeid, []) if r != rank
        )
        when = "call" if "setup" in seen or body_ran else "setup"
        outcomes = {
            d.get("when"): d.get("outcome") for r, d in self.reports.get(nodeid, []) if r == rank
        }
        if "setup" in seen and outcomes.get("setup") != "passed":
            when = "teardown"
        if when not in seen:
            self.reports.setdefault(nodeid, []).append(
                (rank, ended_report(nodeid, location, when, why))
            )
        self.finished.setdefault(nodeid, set()).add(rank)
        finish = protocol.Finish(nodeid=nodeid, location=list(location))
        return [*out, *self._complete(nodeid, finish)]

    def _complete(self, nodeid: str, finish: protocol.Finish) -> list[protocol.Message]:
        if len(self.finished.get(nodeid, ())) < self.world:
            return []
        out = [*self._merged(nodeid), finish]
        if self.current == nodeid:
            self.current = None
            if self.held:
                start = self.held.pop(0)
                self.current = start.nodeid
                out.append(start)
        return out

    def _merged(self, nodeid: str) -> list[protocol.Message]:
        reports = sorted(self.reports.pop(nodeid, []), key=lambda rd: rd[0])
        # Rank 0's --setup-show text goes before the phase of the report that followed it.
        zero = [_PHASES.get(str(d.get("when")), 3) for r, d in reports if r == 0]
        shown = [
            (zero[before] if before < len(zero) else 3, text)
            for before, text in self.shown.pop(nodeid, [])
        ]
        self.started.discard(nodeid)
        self.starts.pop(nodeid, None)
        self.finished.pop(nodeid, None)
        out: list[protocol.Message] = []
        for when in ("setup", "call", "teardown"):
            phase = [(r, d) for r, d in reports if d.get("when") == when]
            if not phase:
                continue
            while shown and shown[0][0] <= _PHASES[when]:
                out.append(shown.pop(0)[1])
            merged = merge_phase(phase)
            out.append(protocol.Report(data=merged))
            if when == "setup" and merged.get("outcome") != "passed":
                # pytest runs no call after a failed or skipped setup: nor does the merge.
                reports = [(r, d) for r, d in reports if d.get("when") != "call"]
        return [*out, *(text for _, text in shown)]
