"""`devpool report --diff OLD NEW`: what changed between two runs, test by test.

Each run is read into its one summary (report.summary), and the tests are compared by
their final outcome and test time: newly failing, fixed, newly flaky, gone, new, and
slower past a factor; and by what they left behind (leaks, issue 52): newly leaking, no
longer leaking, still leaking. Rendered as text, Markdown (for a PR comment) or JSON.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from devpool.outcomes import GATING, Outcome
from devpool.report.record import LeakLine, read_run
from devpool.report.summary import INTERRUPTED, NOT_RUN, RunSummary, summarize

DIFF_SCHEMA = "devpool-diff/1"
SLOWER_FACTOR = 2.0  # default of --slower
SLOWER_FLOOR = 0.1  # seconds: a test faster than this in NEW is never a regression (noise)
_FAILING = frozenset(o.value for o in GATING)
_PASSING = frozenset({Outcome.PASSED.value, "xpassed"})


@dataclass(frozen=True)
class Change:
    """One test whose ending changed, or that came or went."""

    nodeid: str
    old: str | None  # its final category in OLD (None: not in OLD)
    new: str | None
    old_time: float | None = None
    new_time: float | None = None

    def what(self) -> str:
        """'passed → failed', or '0.10s → 0.80s (8.0x)' for a test that got slower."""
        if self.old_time is not None and self.new_time is not None:
            factor = self.new_time / self.old_time if self.old_time > 0 else float("inf")
            return f"{self.old_time:.2f}s → {self.new_time:.2f}s ({factor:.1f}x)"
        return f"{self.old or 'absent'} → {self.new or 'absent'}"

    def line(self) -> str:
        return f"{self.nodeid}: {self.what()}"


@dataclass(frozen=True)
class LeakChange:
    """A test that left something behind in NEW, or in OLD and no longer in NEW."""

    nodeid: str
    old: str | None  # what it left in OLD (its first leak; None: nothing)
    new: str | None
    old_count: int = 0  # its leaks in each run
    new_count: int = 0

    def what(self) -> str:
        """'leaked pid 4242 `cmd` (sees sim:0): terminated', or 'no leak (OLD: pid …)'."""
        if self.new is None:
            return f"no leak (OLD: {_more(self.old, self.old_count)})"
        return f"leaked {_more(self.new, self.new_count)}"

    def line(self) -> str:
        return f"{self.nodeid}: {self.what()}"


def _more(first: str | None, count: int) -> str:
    return f"{first} and {count - 1} more" if count > 1 else str(first)


def _leaks_of(summary: RunSummary) -> dict[str, list[LeakLine]]:
    found: dict[str, list[LeakLine]] = {}
    for leak in summary.leaks:
        found.setdefault(leak.nodeid, []).append(leak)
    return found


def leak_changes(
    old: RunSummary, new: RunSummary
) -> tuple[tuple[LeakChange, ...], tuple[LeakChange, ...], tuple[LeakChange, ...]]:
    """(newly leaking, no longer leaking, still leaking), each in the order of its run. A test
    is no longer leaking only where NEW looked for leaks and ran it to an end."""
    before, after = _leaks_of(old), _leaks_of(new)

    def change(nodeid: str) -> LeakChange:
        was, now = before.get(nodeid, []), after.get(nodeid, [])
        return LeakChange(
            nodeid,
            was[0].what() if was else None,
            now[0].what() if now else None,
            len(was),
            len(now),
        )

    ended = {n for n, outcome in new.outcomes.items() if outcome not in (INTERRUPTED, NOT_RUN)}
    fixed = [n for n in before if n not in after and new.leaks_checked and n in ended]
    return (
        tuple(change(n) for n in after if n not in before),
        tuple(change(n) for n in fixed),
        tuple(change(n) for n in after if n in before),
    )


@dataclass(frozen=True)
class RunDiff:
    """What changed from OLD to NEW, each list in NEW's order (OLD's for gone tests)."""

    old_run: str
    new_run: str
    newly_failing: tuple[Change, ...]
    fixed: tuple[Change, ...]
    newly_flaky: tuple[Change, ...]
    gone: tuple[Change, ...]
    new: tuple[Change, ...]
    slower: tuple[Change, ...]
    factor: float
    newly_leaking: tuple[LeakChange, ...] = ()
    no_longer_leaking: tuple[LeakChange, ...] = ()
    still_leaking: tuple[LeakChange, ...] = ()

    def sections(self) -> list[tuple[str, tuple[Change | LeakChange, ...]]]:
        return [
            ("newly failing", self.newly_failing),
            ("fixed", self.fixed),
            ("newly flaky", self.newly_flaky),
            ("newly leaking", self.newly_leaking),
            ("no longer leaking", self.no_longer_leaking),
            (f"slower by {self.factor:g}x or more", self.slower),
            ("new", self.new),
            ("gone", self.gone),
            ("still leaking", self.still_leaking),
        ]


def diff_runs(old: RunSummary, new: RunSummary, factor: float = SLOWER_FACTOR) -> RunDiff:
    """Compare two runs' summaries test by test."""
    before, after = old.outcomes, new.outcomes
    both = [nodeid for nodeid in after if nodeid in before]

    def change(nodeid: str, timed: bool = False) -> Change:
        if timed:
            return Change(
                nodeid, before[nodeid], after[nodeid], old.durations[nodeid], new.durations[nodeid]
            )
        return Change(nodeid, before.get(nodeid), after.get(nodeid))

    slower = [
        change(nodeid, timed=True)
        for nodeid in both
        if after[nodeid] in _PASSING | {Outcome.FLAKY.value}
        and nodeid in old.durations
        and nodeid in new.durations
        and new.durations[nodeid] >= SLOWER_FLOOR
        and new.durations[nodeid] >= factor * old.durations[nodeid]
    ]
    newly_leaking, no_longer_leaking, still_leaking = leak_changes(old, new)
    return RunDiff(
        old_run=old.run_id,
        new_run=new.run_id,
        newly_failing=tuple(
            change(n) for n in both if after[n] in _FAILING and before[n] not in _FAILING
        ),
        fixed=tuple(change(n) for n in both if before[n] in _FAILING and after[n] in _PASSING),
        newly_flaky=tuple(
            change(n)
            for n in both
            if after[n] == Outcome.FLAKY.value and before[n] != Outcome.FLAKY.value
        ),
        gone=tuple(change(n) for n in before if n not in after),
        new=tuple(change(n) for n in after if n not in before),
        slower=tuple(slower),
        factor=factor,
        newly_leaking=newly_leaking,
        no_longer_leaking=no_longer_leaking,
        still_leaking=still_leaking,
    )


def diff_text(diff: RunDiff) -> str:
    out = [f"devpool diff {diff.old_run} → {diff.new_run}"]
    changed = [(title, changes) for title, changes in diff.sections() if changes]
    if not changed:
        out.append("no test changed its ending, and none got slower")
    for title, changes in changed:
        out.append(f"{title} ({len(changes)}):")
        out += [f"  {c.line()}" for c in changes]
    return "\n".join(out) + "\n"


def diff_markdown(diff: RunDiff) -> str:
    """For a PR comment: a line of totals, then a list per kind of change."""
    from devpool.report.markdown import clean

    counts = ", ".join(f"{len(changes)} {title}" for title, changes in diff.sections() if changes)
    lines = [
        f"## devpool: changes from `{diff.old_run}` to `{diff.new_run}`",
        "",
        counts or "No test changed its ending, and none got slower.",
        "",
    ]
    for title, changes in diff.sections():
        if not changes:
            continue
        lines += [f"### {title.capitalize()} ({len(changes)})", ""]
        lines += [f"- `{clean(c.nodeid)}`: {clean(c.what())}" for c in changes]
        lines.append("")
    return "\n".join(lines) + "\n"


def diff_json(diff: RunDiff) -> str:
    data = {
        "schema": DIFF_SCHEMA,
        "old_run": diff.old_run,
        "new_run": diff.new_run,
        "factor": diff.factor,
        **{
            key: [asdict(c) for c in changes]
            for key, changes in (
                ("newly_failing", diff.newly_failing),
                ("fixed", diff.fixed),
                ("newly_flaky", diff.newly_flaky),
                ("slower", diff.slower),
                ("new", diff.new),
                ("gone", diff.gone),
                ("newly_leaking", diff.newly_leaking),
                ("no_longer_leaking", diff.no_longer_leaking),
                ("still_leaking", diff.still_leaking),
            )
        },
    }
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def render_diff(paths: Sequence[Path], form: str, factor: float) -> str:
    """The diff of two runs (record files or run folders) in one form."""
    old, new = (summarize(read_run(path)) for path in paths)
    diff = diff_runs(old, new, factor)
    return {"text": diff_text, "markdown": diff_markdown, "json": diff_json}[form](diff)
