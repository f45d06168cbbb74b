"""select_recall.py --queue-jobs N (issue 48): the baseline recorded through the queue by N
concurrent jobs into a throwaway PostgreSQL (tests/pg_server.py; the queue and the history
there), then the mutation trials in a fresh clone at another path whose runs read the
baseline from the database alone (`--devpool-history=postgresql://…`, no .devpool folder).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# The standard library's concurrent.futures (psycopg's) first, not this folder's concurrent.py.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
import concurrent.futures  # noqa: E402, F401

import psycopg  # noqa: E402

sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]  # select_recall, pg_server

from select_recall import Project, choose, report, sh, suite_argv, trials  # noqa: E402

from devpool.select.baseline import check_generation  # noqa: E402
from devpool.select.store_pg import SCHEMA, PgStore  # noqa: E402
from pg_server import remove, server_bin, start_server  # noqa: E402


def fleet_trials(project: Project, repo: Path, tmp: Path, args: argparse.Namespace) -> None:
    """--queue-jobs N: the baseline recorded by N concurrent jobs of one queue run into a
    throwaway PostgreSQL (queue and history there); each mutation committed in a fresh clone
    at another path, whose runs read the baseline from the database alone."""
    if server_bin() is None:
        sys.exit("no PostgreSQL server binaries (initdb, pg_ctl) here")
    server = start_server()
    try:
        seconds, manifest, database = record_through_queue(project, repo, tmp, server.url, args)
        clone = tmp / "elsewhere" / "ci" / repo.name
        sh(["git", "clone", "-q", str(repo), str(clone)], tmp)
        if (clone / ".devpool").exists():
            raise RuntimeError("the fresh clone has a .devpool folder")
        executed = {key for key, _ in database["blocks"]}
        print(f"{project.requirement}: baseline of {len(database['tests'])} tests, "
              f"{len(executed)} blocks, read back from the database; selecting in {clone}",
              flush=True)  # fmt: skip
        mutations = choose(project, clone, executed, args.mutations, args.seed)
        state = tmp / "reader"
        state.mkdir()
        store = PgStore(server.url)
        platform, pool = manifest["platform"], manifest["shape"]["pool"]
        rows = trials(project, clone, state, mutations, frozenset(database["tests"]),
                      server.url, store, platform, pool)  # fmt: skip
        if list((clone / ".devpool").glob("select/*/*")):
            raise RuntimeError("a generation was written into the clone's .devpool folder")
        report(rows)
        print(f"recording through the queue: {seconds:.1f} s ({args.queue_jobs} jobs)")
    finally:
        server.stop()
        remove(server)


def record_through_queue(
    project: Project, repo: Path, tmp: Path, url: str, args: argparse.Namespace
) -> tuple[float, dict[str, Any], dict[str, Any]]:
    """N jobs of one queue run, started at once, each its own lock and run folders, recording;
    their wall; the one generation published (its manifest and database), checked to hold
    every test plain pytest collects."""
    run = f"recall-{os.getpid()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVPOOL_", "PYTEST_"))}
    started, jobs = time.perf_counter(), []
    for k in range(args.queue_jobs):
        state = tmp / f"job-{k}"
        state.mkdir()
        queue = (f"--devpool-queue={url}", f"--devpool-queue-run={run}")
        argv = suite_argv(project, state, "record", "record", url, *queue,
                          f"--devpool-run-dir={state / 'run'}")  # fmt: skip
        with open(state / "output.txt", "w", encoding="utf-8") as log:
            jobs.append(subprocess.Popen(argv, cwd=repo, env=env, stdout=log, stderr=log))
    try:
        for job in jobs:
            job.wait(timeout=1800)
    finally:
        for job in jobs:
            if job.poll() is None:
                job.kill()
    seconds = time.perf_counter() - started
    outputs = [(tmp / f"job-{k}" / "output.txt").read_text() for k in range(len(jobs))]
    if any(job.returncode != 0 for job in jobs):
        raise RuntimeError("a recording job failed:\n" + "\n".join(o[-2000:] for o in outputs))
    published = sum(o.count(f"published queue run {run!r}'s baseline") for o in outputs)
    ran = [sum('"job_end"' in line for line in (tmp / f"job-{k}" / "record.jsonl").open())
           for k in range(len(jobs))]  # fmt: skip
    with psycopg.connect(url) as conn:
        rows = conn.execute(f"SELECT bucket, identity FROM {SCHEMA}.select_generations").fetchall()
    if published != 1 or len(rows) != 1:
        raise RuntimeError(f"{published} jobs said they published, {len(rows)} generations")
    found = PgStore(url).newest(*rows[0])
    assert found is not None
    manifest, database = check_generation(found[1], found[2], f"baseline {found[0]}")
    collect = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly",
               "-p", "no:devpool", "-p", "no:cacheprovider", project.tests]  # fmt: skip
    listed = sh(collect, repo).stdout.splitlines()
    collected = {line for line in listed if "::" in line}
    if set(database["tests"]) != collected:
        lost, extra = collected - set(database["tests"]), set(database["tests"]) - collected
        raise RuntimeError(f"the generation lacks {sorted(lost)[:5]}, adds {sorted(extra)[:5]}")
    print(f"recorded through queue run {run!r}: {args.queue_jobs} jobs ran {ran} tests in "
          f"{seconds:.1f} s; one generation, {found[0]}, holds all {len(collected)} tests "
          "plain pytest collects", flush=True)  # fmt: skip
    return seconds, manifest, database
