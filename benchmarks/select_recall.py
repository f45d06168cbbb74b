"""Recall of selective runs on a real project: 30 one-operator mutations, every failing test
must have been selected (issue 11).

Run: python benchmarks/select_recall.py [--project cachetools==8.0.2] [--mutations 30] [--seed 1]

The project's sdist comes from the package index (`pip download --no-deps --no-binary
:all:`), is unpacked into a temporary git repository and committed; one full devpool run
with `--devpool-select record` writes the baseline. Then each mutation (one comparison or
arithmetic operator flipped, or one number changed, each in another function of the
package's own source, functions the baseline saw run first, chosen by the seed) is
committed, the whole suite runs with `--devpool-select shadow` (everything runs; the run
record says what `on` would have run and which failures it would have missed) and
`--junitxml`, and the mutation is reverted. The selection is also computed in process by
`devpool.select.diff.select`, as `devpool select --base HEAD` does, and compared.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import PYTEST

# The devpool of this checkout (also where the installed one points elsewhere), or the
# source folder --devpool-src names (another checkout, one without unfinished edits).
SRC = Path(__file__).resolve().parents[1] / "src"
if "--devpool-src" in sys.argv:
    SRC = Path(sys.argv[sys.argv.index("--devpool-src") + 1]).resolve()
sys.path.insert(0, str(SRC))

from devpool.select.baseline import bucket_of, identity, load_generation  # noqa: E402
from devpool.select.diff import BaselineStore, Current, Selection, select  # noqa: E402
from devpool.select.fingerprints import blocks_of_source  # noqa: E402
from devpool.select.options import select_options  # noqa: E402
from devpool.select.session import store_for  # noqa: E402


@dataclass(frozen=True)
class Project:
    """A third-party project whose tests pass with plain pytest here."""

    requirement: str  # NAME==VERSION
    package: str  # the package's source folder, relative to the sdist's root
    tests: str  # the test path
    pythonpath: str  # added to PYTHONPATH so that the tests import the package


PROJECTS = {
    "cachetools==8.0.2": Project("cachetools==8.0.2", "src/cachetools", "tests", "src"),
}

_FLIP = {
    ast.Lt: (">=", r"<(?!=)"),
    ast.LtE: (">", r"<="),
    ast.Gt: ("<=", r">(?!=)"),
    ast.GtE: ("<", r">="),
    ast.Eq: ("!=", r"=="),
    ast.NotEq: ("==", r"!="),
    ast.Is: ("is not", r"\bis\b(?! not)"),
    ast.IsNot: ("is", r"\bis not\b"),
    ast.In: ("not in", r"(?<!not )\bin\b"),
    ast.NotIn: ("in", r"\bnot in\b"),
    ast.Add: ("-", r"\+"),
    ast.Sub: ("+", r"-"),
    ast.Mult: ("//", r"\*(?!\*)"),
    ast.FloorDiv: ("*", r"//"),
    ast.Div: ("*", r"/(?!/)"),
    ast.Mod: ("//", r"%"),
}


@dataclass(frozen=True)
class Mutation:
    """Replace source[start:end] (character offsets) of one file by `new`."""

    rel: str
    block: str  # the function's block key, as the baseline names it
    start: int
    end: int
    old: str
    new: str

    @property
    def label(self) -> str:
        return f"{self.old.strip()} → {self.new.strip()}"


def _offsets(source: str) -> list[int]:
    starts, total = [], 0
    for line in source.splitlines(keepends=True):
        starts.append(total)
        total += len(line)
    return starts


def _at(source: str, starts: list[int], line: int, col: int) -> int:
    """The character offset of an AST position (its column counts UTF-8 bytes)."""
    text = source[starts[line - 1] :]
    return starts[line - 1] + len(text.encode()[:col].decode())


def candidates(rel: str, source: str) -> list[Mutation]:
    """Every one-token mutation of a comparison, arithmetic operator or number in rel."""
    tree = ast.parse(source)
    module = blocks_of_source(rel, source)
    starts = _offsets(source)
    found = []

    def between(left: ast.expr, right: ast.expr, op: ast.AST, block: str) -> None:
        if type(op) not in _FLIP:
            return
        new, pattern = _FLIP[type(op)]
        start = _at(source, starts, left.end_lineno or 0, left.end_col_offset or 0)
        end = _at(source, starts, right.lineno, right.col_offset)
        hit = list(re.finditer(pattern, source[start:end]))
        if len(hit) == 1:
            a, b = start + hit[0].start(), start + hit[0].end()
            found.append(Mutation(rel, block, a, b, source[a:b], new))

    def own_nodes(function: ast.AST) -> list[ast.AST]:
        """The nodes of a function's body, not those of functions defined inside it."""
        nodes, stack = [], list(getattr(function, "body", []))
        while stack:
            node = stack.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            nodes.append(node)
            stack.extend(ast.iter_child_nodes(node))
        return nodes

    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        block = module.block_at(function.body[0].lineno)
        for node in own_nodes(function):
            if isinstance(node, ast.Compare):
                lefts = [node.left, *node.comparators]
                for left, op, right in zip(lefts, node.ops, node.comparators, strict=False):
                    between(left, right, op, block)
            elif isinstance(node, ast.BinOp):
                between(node.left, node.right, node.op, block)
            elif (
                isinstance(node, ast.Constant)
                and type(node.value) is int
                and node.end_lineno == node.lineno
            ):
                a = _at(source, starts, node.lineno, node.col_offset)
                b = _at(source, starts, node.lineno, node.end_col_offset or 0)
                found.append(Mutation(rel, block, a, b, source[a:b], str(node.value + 1)))
    return found


def choose(
    project: Project, repo: Path, executed: set[str], count: int, seed: int
) -> list[Mutation]:
    """`count` mutations in distinct functions, those the baseline saw run first."""
    pool = []
    for path in sorted((repo / project.package).rglob("*.py")):
        rel = path.relative_to(repo).as_posix()
        pool += candidates(rel, path.read_text(encoding="utf-8"))
    rng = random.Random(seed)
    rng.shuffle(pool)
    pool.sort(key=lambda m: m.block not in executed)  # stable: shuffled within each half
    chosen: dict[str, Mutation] = {}
    for mutation in pool:
        chosen.setdefault(mutation.block, mutation)
        if len(chosen) == count:
            break
    return list(chosen.values())


def sh(argv: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVPOOL_", "PYTEST_"))}
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout[-3000:]}")
    return done


def unpack(project: Project, into: Path) -> Path:
    """Download the sdist, unpack it into a fresh git repository, commit it."""
    sh(
        [
            *(sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"),
            *(project.requirement, "-d", str(into)),
        ],
        into,
    )
    (archive,) = into.glob("*.tar.gz")
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    (top,) = (p for p in into.iterdir() if p.is_dir())
    repo = into / "repo"
    shutil.move(top, repo)
    (repo / ".gitignore").write_text(".devpool/\n__pycache__/\n*.egg-info/\n")
    commit(repo, "the sdist as released", init=True)
    return repo


def commit(repo: Path, message: str, init: bool = False) -> None:
    if init:
        sh(["git", "init", "-q"], repo)
    sh(["git", "add", "-A"], repo)
    who = ["-c", "user.email=bench@devpool", "-c", "user.name=bench"]
    sh(["git", *who, "commit", "-q", "--allow-empty", "-m", message], repo)


def suite_argv(
    project: Project, state: Path, name: str, mode: str, history: Path | str, *more: str
) -> list[str]:
    """The pytest command of one full devpool run; its record and JUnit file are named by
    `name` in `state`."""
    return [
        *PYTEST,
        *("-p", "no:randomly"),
        *("--devices", "sim:0-1", f"--devpool-lock-dir={state / 'locks'}"),
        f"--devpool-history={history}",  # a file, or the fleet's PostgreSQL
        *("--devpool-cpu-slots", "2", f"--devpool-select={mode}"),
        "--devpool-test-timeout=30",  # a flipped loop condition can loop for ever
        "--continue-on-collection-errors",  # a module that no longer imports: run the rest
        f"--devpool-run-record={state / f'{name}.jsonl'}",
        f"--junitxml={state / f'{name}.xml'}",
        *more,
        project.tests,
    ]


def outcome(
    state: Path, name: str, repo: Path, known: frozenset[str] = frozenset()
) -> tuple[dict[str, dict[str, Any]], set[str]]:
    """A finished run's select events, and the failing tests."""
    events = {}
    for line in (state / f"{name}.jsonl").read_text(encoding="utf-8").splitlines():
        event = json.loads(line)
        if event["type"] in ("select", "select_misses", "select_baseline"):
            events[event["type"]] = event
    return events, failing(state / f"{name}.xml", repo, known)


def run_suite(
    project: Project,
    repo: Path,
    state: Path,
    mode: str,
    known: frozenset[str] = frozenset(),
    history: Path | str | None = None,
) -> tuple[dict[str, dict[str, Any]], set[str]]:
    """One full devpool run: the run record's select events, and the failing tests."""
    history = state / "history.sqlite" if history is None else history
    done = sh(suite_argv(project, state, mode, mode, history), repo, check=False)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"{mode} run exited {done.returncode}:\n{done.stdout[-3000:]}")
    return outcome(state, mode, repo, known)


def failing(junit: Path, repo: Path, known: frozenset[str]) -> set[str]:
    """Node ids of the failed or errored testcases of a JUnit file (pytest's naming); a
    module that failed to collect fails every test of it the baseline knows."""
    found = set()
    for case in ElementTree.parse(junit).iter("testcase"):
        error = case.find("error")
        if error is not None and error.get("message") == "collection failure":
            module_path = case.get("name", "").replace(".", "/") + ".py"
            found |= {nodeid for nodeid in known if nodeid.startswith(module_path + "::")}
        elif case.find("failure") is not None or error is not None:
            module = case.get("classname", "").split(".")
            name = case.get("name", "")
            # classname is dotted: the module path, then the class, if any
            for cut in range(len(module), 0, -1):
                path = Path(*module[:cut]).with_suffix(".py")
                if (repo / path).is_file():
                    found.add("::".join([path.as_posix(), *module[cut:], name]))
                    break
    return found


def in_process(
    project: Project,
    repo: Path,
    store: BaselineStore | None = None,
    platform: str | None = None,
    pool: int | None = None,
) -> Selection:
    """The selection `devpool select --base HEAD TESTS` prints (from the project's files), or
    the one a run on `platform` with `pool` devices makes from `store` (the database)."""
    options = select_options({}, "pyproject.toml")
    current = Current(
        root=repo,
        bucket=bucket_of(repo, repo, [project.tests], "", ""),
        options=options,
        identity=identity(options.key_packages),
        rev="HEAD",
        platform=platform,
        pool=pool,
    )
    selection = select(store_for(repo) if store is None else store, current)
    if selection.full_reason is not None:
        raise RuntimeError(f"full run: {selection.full_reason}")
    return selection


Row = tuple[Mutation, int, int, int, set[str]]


def trials(
    project: Project,
    repo: Path,
    state: Path,
    mutations: list[Mutation],
    known: frozenset[str],
    history: str | None = None,
    store: BaselineStore | None = None,
    platform: str | None = None,
    pool: int | None = None,
) -> list[Row]:
    """Each mutation committed, the suite run in shadow mode and the selection computed in
    process, the mutation reverted: (mutation, failing, selected, total, missed) each."""
    rows: list[Row] = []
    for number, mutation in enumerate(mutations, 1):
        path = repo / mutation.rel
        original = path.read_text(encoding="utf-8")
        path.write_text(
            original[: mutation.start] + mutation.new + original[mutation.end :],
            encoding="utf-8",
        )
        commit(repo, f"mutation {number}: {mutation.block} {mutation.label}")
        events, failed = run_suite(project, repo, state, "shadow", known, history)
        selection = in_process(project, repo, store, platform, pool)
        chosen = selection.selected
        path.write_text(original, encoding="utf-8")
        commit(repo, f"revert mutation {number}")
        select_event = events["select"]
        if select_event.get("full_run"):
            raise RuntimeError(f"mutation {number}: full run: {select_event.get('reason')}")
        total = len(known)  # the baseline's tests
        missed = set(events["select_misses"]["misses"])
        if missed != failed - set(chosen):
            print(f"  NOTE: the run record's misses {sorted(missed)} differ from in process")
        if (select_event["selected"], select_event["generation"]) != (
            len(chosen),
            selection.generation,
        ):  # the run counts only the tests it collected: a module that no longer imports
            print(f"  NOTE: the run record selected {select_event['selected']} of the "
                  f"{select_event['total']} tests it collected from {select_event['generation']}"
                  f", in process {len(chosen)} of {total} from {selection.generation}")  # fmt: skip
        missed |= failed - set(chosen)
        rows.append((mutation, len(failed), len(chosen), total, missed))
        print(
            f"  {number:2} {mutation.block:<55} {mutation.label:<12} "
            f"failing {len(failed):3}  selected {len(chosen):3}/{total}  "
            f"missed {len(missed)}" + (f": {', '.join(sorted(missed)[:3])}" if missed else ""),
            flush=True,
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", choices=list(PROJECTS), default="cachetools==8.0.2")
    parser.add_argument("--mutations", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--devpool-src", type=Path, help="devpool's src folder (default: ours)")
    parser.add_argument(
        "--queue-jobs",
        type=int,
        default=0,
        help="record through the queue with N (2-4) jobs into a throwaway PostgreSQL; "
        "select in a fresh clone at another path from the database alone",
    )
    args = parser.parse_args()
    if args.queue_jobs and not 2 <= args.queue_jobs <= 4:
        parser.error("--queue-jobs takes 2, 3 or 4")
    project = PROJECTS[args.project]
    with tempfile.TemporaryDirectory(prefix="devpool-recall-") as tmp:
        os.environ["PYTHONPATH"] = os.pathsep.join([project.pythonpath, str(SRC)])
        repo = unpack(project, Path(tmp))
        state = Path(tmp) / "state"
        state.mkdir()
        if args.queue_jobs:
            from select_recall_fleet import fleet_trials

            fleet_trials(project, repo, Path(tmp), args)
            return
        events, failed = run_suite(project, repo, state, "record")
        if failed or "select_baseline" not in events:
            raise RuntimeError(f"the baseline run did not pass: {sorted(failed)[:5]}")
        total = events["select_baseline"]["tests"]
        (generation,) = (repo / ".devpool" / "select").glob("*/*")
        database = load_generation(generation)[1]
        executed = {key for key, _ in database["blocks"]}
        print(
            f"{project.requirement}: baseline of {total} tests, {len(executed)} blocks", flush=True
        )
        mutations = choose(project, repo, executed, args.mutations, args.seed)
        report(trials(project, repo, state, mutations, frozenset(database["tests"])))


def report(rows: list[Row]) -> None:
    failing_total = sum(n for _, n, *_ in rows)
    missed_total = sum(len(m) for *_, m in rows)
    ratios = [selected / total for _, _, selected, total, _ in rows]
    chosen = [selected for _, _, selected, _, _ in rows]
    uncaught = sum(1 for _, n, *_ in rows if n == 0)
    recall = 1 - missed_total / failing_total if failing_total else 1.0
    print(
        f"recall {recall:.1%} ({failing_total - missed_total} of {failing_total} failing tests "
        f"selected, {len(rows)} mutations); median selection ratio "
        f"{statistics.median(ratios):.1%} (range {min(ratios):.1%}–{max(ratios):.1%}); "
        f"{uncaught} mutations no test caught"
    )
    print(
        f"{len(rows) - uncaught} mutations with failures; selected per mutation: median "
        f"{statistics.median(chosen):g}, mean {statistics.mean(chosen):.1f} of "
        f"{max(total for *_, total, _ in rows)} tests"
    )
    print("target: recall 100%: " + ("met" if missed_total == 0 else "MISSED"))


if __name__ == "__main__":
    main()
