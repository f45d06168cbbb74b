"""`devpool shard verify`: prove from the run records that the shards of one CI run
partitioned the suite, every test ran exactly once.

Each `--devpool-shard K/N` run writes a `shard` event into its record: its K/N, the whole
split (every shard's node ids) and the split's fingerprint. The check reads every
shard's record and fails, naming the tests, when a test ran in no shard or in two, when
the shards split differently (different fingerprints), or when a shard K/N is missing or
given twice. A test the shard's own selection dropped after the split (`-k`, `-m`) is
not missing: the record lists those as deselected.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from devpool.errors import DevpoolError
from devpool.report.record import RunRecord, read_record
from devpool.wording import counted


@dataclass(frozen=True)
class ShardRun:
    """What one shard's record says: which shard, how the suite was split, what ran."""

    path: Path
    k: int
    n: int
    fingerprint: str
    costs: str
    split: tuple[frozenset[str], ...]  # node ids per shard, as this shard computed them
    deselected: frozenset[str]  # its own tests dropped after the split (-k, -m)
    ran: frozenset[str]  # tests with at least one ended attempt in this record
    finished: bool

    @property
    def label(self) -> str:
        return f"{self.k}/{self.n}"


def _strings(value: object, what: str) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{what} is not a list of node ids")
    return frozenset(value)


def shard_run(record: RunRecord) -> ShardRun:
    """The shard facts of one record; DevpoolError when it has none or they are malformed."""
    event = record.shard
    if event is None:
        raise DevpoolError(
            f"{record.path} has no shard event: it was not a --devpool-shard run "
            "(or a devpool without shard fingerprints wrote it)"
        )
    try:
        k, n = event["k"], event["n"]
        if not (isinstance(k, int) and isinstance(n, int) and 1 <= k <= n):
            raise ValueError(f"shard {k!r}/{n!r} is not K/N with 1 ≤ K ≤ N")
        split = event["split"]
        if not isinstance(split, list) or len(split) != n:
            raise ValueError(f"its split does not hold {n} shards")
        return ShardRun(
            path=record.path,
            k=k,
            n=n,
            fingerprint=str(event["fingerprint"]),
            costs=str(event["costs"]),
            split=tuple(_strings(s, f"shard {i} of the split") for i, s in enumerate(split, 1)),
            deselected=_strings(event.get("deselected", []), "deselected"),
            ran=frozenset(job.test_id for job in record.finished_jobs()),
            finished=record.finished,
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise DevpoolError(f"{record.path}: its shard event is damaged ({exc})") from None


def read_shard_runs(paths: Sequence[Path]) -> list[ShardRun]:
    """Every record's shard facts; DevpoolError (one sentence) for an unreadable record."""
    if not paths:
        raise DevpoolError("give the run records of every shard, e.g. shard-*/record.jsonl")
    return [shard_run(read_record(Path(path))) for path in paths]


@dataclass
class ShardVerdict:
    """The outcome of a check: problems (each a sentence, maybe with node ids under it)."""

    runs: list[ShardRun]
    problems: list[tuple[str, list[str]]] = field(default_factory=list)
    suite: set[str] = field(default_factory=set)

    @property
    def ok(self) -> bool:
        return not self.problems

    def render(self) -> str:
        """One OK line, or every problem with the tests it names, one per line."""
        if self.ok:
            run = self.runs[0]
            dropped = set().union(*(r.deselected for r in self.runs))
            note = f", {len(dropped)} deselected by the shards' own options" if dropped else ""
            return (
                f"devpool shard verify: OK: {counted(run.n, 'shard')}, "
                f"{counted(len(self.suite) - len(dropped), 'test')}, each ran exactly once"
                f"{note} (split {run.fingerprint})\n"
            )
        lines = [f"devpool shard verify: FAILED ({counted(len(self.runs), 'record')})"]
        for sentence, tests in self.problems:
            lines.append(f"  {sentence}")
            lines += [f"    {test}" for test in tests]
        return "\n".join(lines) + "\n"


def verify(runs: Sequence[ShardRun]) -> ShardVerdict:
    """Check that the records are the N shards of one split, each test run exactly once."""
    verdict = ShardVerdict(list(runs))
    problem = verdict.problems.append
    sizes = sorted({run.n for run in runs})
    if len(sizes) > 1:
        problem(
            (
                "the records disagree on the number of shards: "
                + "; ".join(f"{run.path} is {run.label}" for run in runs),
                [],
            )
        )
    fingerprints = sorted({run.fingerprint for run in runs})
    if len(fingerprints) > 1:
        costs = "differ" if len({run.costs for run in runs}) > 1 else "agree"
        problem(
            (
                f"the shards were split differently ({len(fingerprints)} fingerprints; their "
                f"cost snapshots {costs}: start every shard from the same history): "
                + "; ".join(f"{run.label} {run.fingerprint} in {run.path}" for run in runs),
                [],
            )
        )
    labels = Counter((run.k, run.n) for run in runs)
    for (k, n), count in sorted(labels.items()):
        if count > 1:
            paths = ", ".join(str(run.path) for run in runs if (run.k, run.n) == (k, n))
            problem((f"shard {k}/{n} is given {count} times: {paths}", []))
    for n in sizes:
        missing = [k for k in range(1, n + 1) if (k, n) not in labels]
        for k in missing:
            expected = sorted(set().union(*(r.split[k - 1] for r in runs if r.n == n)))
            problem((f"shard {k}/{n} has no record; the split gives it {len(expected)} tests", []))
    for run in runs:
        if not run.finished:
            problem((f"{run.path} (shard {run.label}) is the record of a run that was cut", []))
    verdict.suite = set().union(*(part for run in runs for part in run.split))
    deselected = set().union(*(run.deselected for run in runs))
    times = Counter(test for run in runs for test in run.ran)
    never = sorted(verdict.suite - deselected - set(times))
    if never:
        problem((f"{_tests(len(never))} ran in no shard:", never))
    twice = sorted(test for test, count in times.items() if count > 1)
    if twice:
        where = {test: ", ".join(run.label for run in runs if test in run.ran) for test in twice}
        problem(
            (
                f"{_tests(len(twice))} ran more than once:",
                [f"{t}  (shards {where[t]})" for t in twice],
            )
        )
    return verdict


def _tests(count: int) -> str:
    return counted(count, "test")
