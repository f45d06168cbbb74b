"""End to end: selective runs for a fleet. A baseline recorded in one checkout selects in
another at another path; baselines kept in the fleet's PostgreSQL beside the history.

Each session is a real pytest process in a real git repository on sim devices; what it ran
is read back from its run record."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from select_project import PROJECT, build_library, git, git_project, native_project, write
from sessions import FAST

from pg_server import free_port

pytestmark = pytest.mark.usefixtures("selective_env")


class Session:
    """One pytest session started in `root` (its own cwd), read back from its run record."""

    def __init__(self, root: Path, tmp: Path, name: str, *args: str, env: Any = None) -> None:
        self.record = tmp / f"{name}.jsonl"
        self.done = subprocess.run(
            [sys.executable, "-m", "pytest", *FAST, f"--devpool-lock-dir={tmp / 'locks'}",
             f"--devpool-run-record={self.record}", "--devpool-skip-unsatisfiable",
             "--devices", "sim:0-1", *args, "tests"],
            cwd=root, capture_output=True, text=True, timeout=240, env=env,
        )  # fmt: skip
        self.output = self.done.stdout + self.done.stderr
        lines = self.record.read_text().splitlines() if self.record.exists() else []
        self.events = [json.loads(line) for line in lines]

    @property
    def ran(self) -> set[str]:
        return {e["nodeid"] for e in self.events if e["type"] == "job_end"}

    @property
    def select(self) -> dict[str, Any]:
        (event,) = [e for e in self.events if e["type"] == "select"]
        return event


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/self/maps")
def test_a_baseline_recorded_at_one_checkout_path_selects_alike_at_another(
    tmp_path: Path,
) -> None:
    """A runner checks out at /runner/1/_work/x, another at /home/ci/x: the baseline names
    files, blocks and the project's own libraries relative to the rootdir."""
    first = tmp_path / "runner" / "1" / "_work" / "x"
    files = native_project("build")
    files["tests/test_math.py"] = PROJECT["tests/test_math.py"]
    files["lib.py"] = PROJECT["lib.py"]
    write(first, files)
    build_library(first, "build", 1)
    git(first, "init", "-q")
    git(first, "add", "-A")
    git(first, "commit", "-qm", "init")
    isolated = ("--devpool-isolation", "job")  # a library one test loaded stays in a warm worker
    recorded = Session(first, tmp_path, "record", *isolated, "--devpool-select", "record")
    assert recorded.done.returncode == 0, recorded.output
    # A fresh checkout elsewhere: every file copied anew (new mtimes), the baseline with it.
    second = tmp_path / "home" / "ci" / "x"
    shutil.copytree(first, second, symlinks=True, copy_function=shutil.copy)

    def on(root: Path, name: str) -> Session:
        run = Session(root, tmp_path, name, *isolated, "--devpool-select", "on")
        assert run.done.returncode == 0, run.output
        assert run.select["full_run"] is False, run.output
        return run

    assert on(second, "same").ran == set()
    # The same change at each path selects the same tests: the second checkout first, while
    # the first one's library is still the recorded one.
    ran = {}
    for root in (second, first):
        build_library(root, "build", 2)
        lib = root / "lib.py"
        lib.write_text(lib.read_text().replace("return a * b", "return b * a"))
        git(root, "commit", "-qam", "k returns 2, mul turned")
        ran[root] = on(root, root.parent.name).ran
    assert (
        ran[second]
        == ran[first]
        == {
            "tests/test_native.py::test_native",
            "tests/test_math.py::test_mul",
            "tests/test_math.py::test_both",
        }
    )


# ---- baselines in PostgreSQL ---------------------------------------------------------------


def database_of(postgres: Any) -> str:
    """A database of its own on the session's server: no generation of another test."""
    import psycopg

    name = f"sel_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return postgres.url.rsplit("/", 1)[0] + "/" + name


def sql(url: str, query: str, *params: Any) -> list[Any]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(query, params or None)
        return cursor.fetchall() if cursor.description else []


def clone(source: Path, target: Path) -> Path:
    """A fresh checkout of the source's commit: no .devpool folder, another path."""
    subprocess.run(["git", "clone", "-q", str(source), str(target)], check=True)
    assert not (target / ".devpool").exists()
    return target


def turn_mul(root: Path) -> None:
    lib = root / "lib.py"
    lib.write_text(lib.read_text().replace("return a * b", "return b * a"))


MUL = {"tests/test_math.py::test_mul", "tests/test_math.py::test_both"}
MATH_IDS = [f"tests/test_math.py::test_{n}" for n in ("add", "mul", "both")]
DATA_IDS = [f"tests/test_data.py::test_{n}" for n in ("reads_config", "plain", "kernels", "eight")]
EIGHT = "tests/test_data.py::test_eight"


def test_baselines_live_in_the_database_and_each_runner_shape_reads_its_own(
    postgres: Any, tmp_path: Path
) -> None:
    url = database_of(postgres)
    history = f"--devpool-history={url}"
    first = git_project(tmp_path / "runner" / "x", PROJECT)
    for devices in ("sim:0-1", "sim:0-7"):  # a 2-device and an 8-device runner record
        done = Session(first, tmp_path, f"rec{devices[-1]}", history, "--devpool-select",
                       "record", "--devices", devices)  # fmt: skip
        assert done.done.returncode == 0, done.output
        assert "devpool select: recorded baseline" in done.output
    assert not list((first / ".devpool" / "select").glob("*/*/manifest.json"))
    assert len(sql(url, "SELECT 1 FROM devpool_history.select_generations")) == 2
    # a fresh checkout at another path, with no .devpool folder, reads the database only
    second = clone(first, tmp_path / "home" / "ci" / "x")
    turn_mul(second)
    small = Session(second, tmp_path, "small", history, "--devpool-select", "on")
    assert small.select["full_run"] is False, small.output
    assert small.ran == MUL | {EIGHT}  # skipped at 2 devices when recorded: no evidence
    big = Session(second, tmp_path, "big", history, "--devpool-select", "on", "--devices",
                  "sim:0-7")  # fmt: skip
    assert big.select["full_run"] is False, big.output
    assert big.ran == MUL  # the 8-device runners' baseline saw test_eight pass
    assert big.select["generation"] != small.select["generation"]


def test_a_database_away_damaged_or_newer_gives_a_full_run_with_one_line(
    postgres: Any, tmp_path: Path
) -> None:
    url = database_of(postgres)
    root = git_project(tmp_path / "x", PROJECT)
    recorded = Session(root, tmp_path, "rec", f"--devpool-history={url}", "--devpool-select",
                       "record")  # fmt: skip
    assert recorded.done.returncode == 0, recorded.output
    turn_mul(root)
    everything = Session(root, tmp_path, "plain").ran  # the full run, as devpool runs it
    port = sql(url, "SELECT inet_server_port()")[0][0]
    away = url.replace(f":{port}/", f":{free_port()}/")
    cases = {
        "away": (away, "cannot reach PostgreSQL"),
        "damaged": (url, "its database is damaged (checksum mismatch)"),
        "newer": (url, "written by a newer devpool"),
    }
    for name, (where, said) in cases.items():
        if name == "damaged":
            sql(url, "UPDATE devpool_history.select_generations SET manifest = "
                "replace(manifest, '\"db_sha256\": \"', '\"db_sha256\": \"0')")  # fmt: skip
        if name == "newer":
            sql(url, "UPDATE devpool_history.select_meta SET value = '99' WHERE key = 'schema'")
        run = Session(root, tmp_path, name, f"--devpool-history={where}", "--devpool-select", "on")
        assert run.done.returncode == 0, run.output
        assert run.select["full_run"] is True and said in run.select["reason"], run.select
        lines = [line for line in run.output.splitlines() if "full run:" in line]
        assert len(lines) == 1 and said in lines[0], run.output
        assert run.ran == everything
        assert "Traceback" not in run.output


def test_two_recordings_at_once_both_publish_and_the_newer_wins(
    postgres: Any, tmp_path: Path
) -> None:
    from devpool.select.store_pg import KEEP, PgStore

    url = database_of(postgres)
    root = git_project(tmp_path / "x", PROJECT)
    args = [sys.executable, "-m", "pytest", *FAST, "--devices", "sim:0-1", "tests",
            "--devpool-skip-unsatisfiable", f"--devpool-history={url}", "--devpool-select",
            "record"]  # fmt: skip
    jobs = [
        subprocess.Popen(
            [
                *args,
                f"--devpool-lock-dir={tmp_path / f'locks{i}'}",
                f"--devpool-run-dir={tmp_path / f'run{i}'}",
            ],
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for i in range(2)
    ]
    outputs = [job.communicate(timeout=240)[0] for job in jobs]
    assert [job.returncode for job in jobs] == [0, 0], outputs
    rows = sql(url, "SELECT generation FROM devpool_history.select_generations ORDER BY id")
    assert len(rows) == 2
    turn_mul(root)
    run = Session(root, tmp_path, "on", f"--devpool-history={url}", "--devpool-select", "on")
    assert run.select["generation"] == rows[-1][0] and run.ran == MUL | {EIGHT}, run.output
    # the last KEEP of a bucket and identity are kept
    store = PgStore(url)
    manifest = json.loads(sql(url, "SELECT manifest FROM devpool_history.select_generations")[0][0])
    for _ in range(KEEP + 2):
        store.write(manifest, {"blocks": [], "files": [], "libs": [], "tests": {}})
    assert len(sql(url, "SELECT 1 FROM devpool_history.select_generations")) == KEEP


# ---- recording and selecting through the queue --------------------------------------------

DEVPOOL = "import sys; from devpool.cli import main; sys.exit(main(sys.argv[1:]))"
BLOCK = {
    "tests/test_block.py": """
        import os
        import time
        from pathlib import Path

        OUT = Path(os.environ.get("OUT", "."))


        def test_block():
            # in the doomed job: say so, then wait to be killed (bounded)
            if os.environ.get("JOB") != "doomed":
                return
            (OUT / "started").write_text(str(os.getpid()))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                time.sleep(0.05)
        """,
}


def job(root: Path, tmp: Path, name: str, url: str, run: str, *more: str) -> subprocess.Popen[str]:
    """One CI job of a queue run: its own lock and run folders, 8 sim devices."""
    env = {**os.environ, "JOB": name, "OUT": str(tmp)}
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", *FAST, "tests", "-q", "--devices=sim:0-7",
         f"--devpool-lock-dir={tmp / ('locks-' + name)}", f"--devpool-run-dir={tmp / name}",
         f"--devpool-queue={url}", f"--devpool-queue-run={run}", f"--devpool-history={url}",
         *more],
        cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip


def queue_jobs(root: Path, tmp: Path, url: str, run: str, *more: str) -> list[str]:
    """Two jobs of one queue run, both ending 0; their outputs."""
    started = [job(root, tmp, f"{run}-{i}", url, run, *more) for i in range(2)]
    outputs = [proc.communicate(timeout=240)[0] for proc in started]
    assert [proc.returncode for proc in started] == [0, 0], outputs
    return outputs


def queue_report(root: Path, url: str, run: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", DEVPOOL, "queue", "report", f"--devpool-queue={url}",
         f"--devpool-queue-run={run}", "--wait=60"],
        cwd=root, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def newest_tests(url: str) -> set[str]:
    """The tests of the newest generation in the database."""
    from devpool.select.store_pg import PgStore

    rows = sql(url, "SELECT bucket, identity FROM devpool_history.select_generations")
    found = PgStore(url).newest(*rows[-1])
    assert found is not None
    return set(json.loads(found[2])["tests"])


def test_a_recording_through_the_queue_is_published_once_and_selects_under_the_queue(
    postgres: Any, tmp_path: Path
) -> None:
    url = database_of(postgres)
    first = git_project(tmp_path / "runner" / "x", PROJECT)
    outputs = queue_jobs(first, tmp_path, url, "rec-1", "--devpool-select=record")
    assert "\n".join(outputs).count("published queue run 'rec-1''s baseline") == 1, outputs
    assert len(sql(url, "SELECT 1 FROM devpool_history.select_generations")) == 1
    assert newest_tests(url) == {*MATH_IDS, *DATA_IDS}
    # The oracle: the same change selected from a baseline recorded in one process.
    alone = git_project(tmp_path / "alone", PROJECT)
    home = ("--devices", "sim:0-7")
    assert Session(alone, tmp_path, "alone", *home, "--devpool-select", "record").ran
    turn_mul(alone)
    expected = Session(alone, tmp_path, "alone-on", *home, "--devpool-select", "on").ran
    assert expected == MUL
    # A PR's fresh checkout elsewhere selects from the database alone...
    second = clone(first, tmp_path / "home" / "ci" / "x")
    turn_mul(second)
    history = f"--devpool-history={url}"
    run = Session(second, tmp_path, "pr", history, *home, "--devpool-select", "on")
    assert run.select["full_run"] is False and run.ran == expected, run.output
    # ... and under the queue, which then holds only the selected tests
    queue_jobs(second, tmp_path, url, "pr-1", "--devpool-select=on")
    held = sql(url, "SELECT test_id FROM devpool_queue_tests WHERE run_id = 'pr-1'")
    assert {row[0] for row in held} == expected
    verdict = queue_report(second, url, "pr-1")
    assert verdict.returncode == 0, verdict.stdout + verdict.stderr
    assert "devpool select: 2 of 7 selected (baseline " in verdict.stdout
    # a full run says why
    (second / "tests" / "conftest.py").write_text("# changed\n")
    queue_jobs(second, tmp_path, url, "pr-2", "--devpool-select=on")
    verdict = queue_report(second, url, "pr-2")
    assert verdict.returncode == 0, verdict.stdout + verdict.stderr
    assert (
        "devpool select: 7 of 7 selected, a full run: compatibility input changed: "
        "tests/conftest.py" in verdict.stdout
    )


def test_a_killed_recording_job_publishes_nothing_and_its_tests_are_recorded_elsewhere(
    postgres: Any, tmp_path: Path
) -> None:
    url = database_of(postgres)
    root = git_project(tmp_path / "x", {**PROJECT, **BLOCK})
    lease = ("--devpool-select=record", "--devpool-queue-lease=2")
    doomed = job(root, tmp_path, "doomed", url, "kill-1", *lease)
    deadline = time.monotonic() + 120
    while not (tmp_path / "started").exists():
        assert doomed.poll() is None, doomed.communicate()[0]
        assert time.monotonic() < deadline, "the doomed job never reached its blocking test"
        time.sleep(0.05)
    survivor = job(root, tmp_path, "survivor", url, "kill-1", *lease)
    os.killpg(doomed.pid, signal.SIGKILL)
    doomed.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.kill(int((tmp_path / "started").read_text()), signal.SIGKILL)  # its worker
    assert not sql(url, "SELECT to_regclass('devpool_history.select_generations')")[0][0] or not (
        sql(url, "SELECT 1 FROM devpool_history.select_generations")
    )  # nothing published by the killed job
    output = survivor.communicate(timeout=240)[0]
    assert survivor.returncode == 0, output
    assert "published queue run 'kill-1''s baseline" in output
    assert newest_tests(url) == {*MATH_IDS, *DATA_IDS, "tests/test_block.py::test_block"}
    second = clone(root, tmp_path / "elsewhere")
    turn_mul(second)
    run = Session(second, tmp_path, "pr", f"--devpool-history={url}", "--devices", "sim:0-7",
                  "--devpool-select", "on")  # fmt: skip
    assert run.select["full_run"] is False and run.ran == MUL, run.output


def test_recording_through_the_queue_into_a_history_file_is_refused(tmp_path: Path) -> None:
    root = git_project(tmp_path / "x", PROJECT)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *FAST, "tests", "--devices=sim:0-1",
         "--devpool-queue=postgresql://devpool@127.0.0.1:1/none", "--devpool-queue-run=r",
         f"--devpool-history={tmp_path / 'history.sqlite'}", "--devpool-select=record"],
        cwd=root, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 4, done.stdout + done.stderr
    assert "set --devpool-history=postgresql://" in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr


# ---- recording split into shards ------------------------------------------------------------


def merge(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", DEVPOOL, "select", "merge", *args],
        cwd=root, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize("where", ["files", "database"])
def test_shards_record_parts_that_a_merge_step_publishes(
    where: str, postgres: Any, tmp_path: Path
) -> None:
    first = git_project(tmp_path / "runner" / "x", PROJECT)
    url = database_of(postgres) if where == "database" else ""
    more = (f"--devpool-history={url}", "--devpool-queue-run=ci-7") if url else ()
    ran: set[str] = set()
    for shard in (1, 2):
        part = Session(first, tmp_path, f"shard{shard}", *more, "--devices", "sim:0-7",
                       "--devpool-select", "record", f"--devpool-shard={shard}/2")  # fmt: skip
        assert part.done.returncode == 0, part.output
        assert f"shard {shard}/2's part of the baseline" in part.output
        ran |= part.ran
        if shard == 1:  # one shard's part alone is no baseline
            early = merge(first, *(more or [str(p) for p in first.rglob("1-of-2.json")]))
            assert early.returncode == 4 and "lacks the part of shard 2/2" in early.stderr, early
    assert ran == {*MATH_IDS, *DATA_IDS}
    parts = [] if url else [str(p) for p in sorted(first.rglob("*-of-2.json"))]
    done = merge(first, *more, *parts)
    assert done.returncode == 0 and "published baseline" in done.stdout, done
    # files: the project that merged selects; a database: any checkout does
    second = clone(first, tmp_path / "home" / "x") if url else first
    turn_mul(second)
    run = Session(second, tmp_path, "on", *more[:1], "--devices", "sim:0-7", "--devpool-select",
                  "on")  # fmt: skip
    assert run.select["full_run"] is False and run.ran == MUL, run.output


# ---- the history's database going away mid-recording ---------------------------------------

HOLD = {
    "tests/test_hold.py": """
        import os
        import time
        from pathlib import Path

        OUT = Path(os.environ.get("OUT", "."))


        def test_hold():
            # in the held run: say so, then wait for the release (bounded)
            if os.environ.get("JOB") != "held":
                return
            (OUT / "started").write_text(str(os.getpid()))
            deadline = time.monotonic() + 120
            while not (OUT / "release").exists():
                assert time.monotonic() < deadline, "never released"
                time.sleep(0.05)
        """,
}


def held_run(root: Path, tmp: Path, history: str, queue: str | None) -> subprocess.Popen[str]:
    """A recording run whose test_hold waits for tmp/release: one queue job (the queue in
    another server than the history), or a run of its own."""
    if queue is not None:
        return job(root, tmp, "held", queue, "held-run", "--devpool-select=record", history)
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", *FAST, "tests", "-q", "--devices=sim:0-7",
         f"--devpool-lock-dir={tmp / 'locks-held'}", f"--devpool-run-dir={tmp / 'held'}",
         history, "--devpool-select=record"],
        cwd=root, env={**os.environ, "JOB": "held", "OUT": str(tmp)}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip


@pytest.mark.parametrize("through", ["queue", "alone"])
def test_the_history_database_going_away_mid_recording_publishes_nothing(
    through: str, postgres: Any, tmp_path: Path
) -> None:
    """The history's own server is stopped while a recording run's test runs: the run ends
    as its tests say, one line says the baseline was not published, and once the server is
    back the newest generation is still the one before."""
    from pg_server import remove, start_server

    own = start_server()  # the history's server, stopped mid-run; the queue stays up
    held = None
    try:
        history = f"--devpool-history={own.url}"
        queue = database_of(postgres) if through == "queue" else None
        root = git_project(tmp_path / "x", {**PROJECT, **HOLD})
        if queue is not None:
            first = job(root, tmp_path, "first", queue, "first-run", "--devpool-select=record",
                        history)  # fmt: skip
            output = first.communicate(timeout=240)[0]
            assert first.returncode == 0 and "published queue run 'first-run''s" in output, output
        else:
            done = Session(root, tmp_path, "first", history, "--devices", "sim:0-7",
                           "--devpool-select", "record")  # fmt: skip
            assert done.done.returncode == 0, done.output
        ((before,),) = sql(own.url, "SELECT generation FROM devpool_history.select_generations")
        held = held_run(root, tmp_path, history, queue)
        deadline = time.monotonic() + 120
        while not (tmp_path / "started").exists():
            assert held.poll() is None, held.communicate()[0]
            assert time.monotonic() < deadline, "the held run never reached test_hold"
            time.sleep(0.05)
        own._run(str(own.bin / "pg_ctl"), "stop", "-m", "immediate", "-w", "-D", str(own.data))
        (tmp_path / "release").write_text("")
        output = held.communicate(timeout=240)[0]
        own.start()
        assert held.returncode == 0, output  # every test passed
        said = [line for line in output.splitlines() if "baseline not published" in line]
        assert len(said) == 1 and f"127.0.0.1:{own.port}" in said[0], output
        assert "Traceback" not in output
        if queue is not None:  # a job that ends the run later, the server back, publishes not
            late = job(root, tmp_path, "late", queue, "held-run", "--devpool-select=record",
                       history)  # fmt: skip
            output = late.communicate(timeout=240)[0]
            said = [line for line in output.splitlines() if "baseline not published" in line]
            assert late.returncode == 0 and len(said) == 1, output
            assert "no recorded dependencies" in said[0] and "Traceback" not in output, output
        rows = sql(own.url, "SELECT generation FROM devpool_history.select_generations")
        assert rows == [(before,)]
        second = clone(root, tmp_path / "elsewhere")
        turn_mul(second)
        run = Session(second, tmp_path, "pr", history, "--devices", "sim:0-7",
                      "--devpool-select", "on")  # fmt: skip
        assert run.select["generation"] == before and run.ran == MUL, run.output
    finally:
        if held is not None and held.poll() is None:  # a failed wait: end the run we started
            os.killpg(held.pid, signal.SIGKILL)
            held.wait(timeout=30)
        own.stop()
        remove(own)


# ---- auto under the queue ---------------------------------------------------------------------

GITHUB = {  # what GitHub Actions sets in every job; the queue run is named explicitly
    "CI": "true",
    "GITHUB_ACTIONS": "true",
    "GITHUB_RUN_ID": "4242",
    "GITHUB_RUN_ATTEMPT": "1",
    "GITHUB_REPOSITORY": "org/x",
}


def test_auto_under_the_queue_records_in_the_merge_queue_and_selects_on_a_pull_request(
    postgres: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = database_of(postgres)
    first = git_project(tmp_path / "runner" / "x", PROJECT)
    merge_queue = {
        "GITHUB_EVENT_NAME": "merge_group",
        "GITHUB_REF_NAME": "gh-readonly-queue/main/pr-7",
    }
    for name, value in {**GITHUB, **merge_queue}.items():
        monkeypatch.setenv(name, value)
    outputs = "\n".join(queue_jobs(first, tmp_path, url, "mq-1", "--devpool-select=auto"))
    chose = "devpool select: auto: full run and new baseline (merge-queue is in full-on)"
    assert outputs.count(chose) == 2, outputs
    assert outputs.count("published queue run 'mq-1''s baseline") == 1, outputs
    assert "recorded baseline" not in outputs, outputs  # one job's share is no baseline
    assert len(sql(url, "SELECT 1 FROM devpool_history.select_generations")) == 1
    assert newest_tests(url) == {*MATH_IDS, *DATA_IDS}
    # A pull request's jobs, on a fresh checkout with a change: auto selects under the queue.
    second = clone(first, tmp_path / "home" / "ci" / "x")
    turn_mul(second)
    pull_request = {"GITHUB_EVENT_NAME": "pull_request", "GITHUB_HEAD_REF": "feature",
                    "GITHUB_BASE_REF": "main", "GITHUB_REF_NAME": "7/merge"}  # fmt: skip
    for name, value in pull_request.items():
        monkeypatch.setenv(name, value)
    outputs = "\n".join(queue_jobs(second, tmp_path, url, "pr-7", "--devpool-select=auto"))
    chose = "devpool select: auto: selective run (branch feature is not in full-on)"
    assert outputs.count(chose) == 2 and "'s baseline" not in outputs, outputs
    held = sql(url, "SELECT test_id FROM devpool_queue_tests WHERE run_id = 'pr-7'")
    assert {row[0] for row in held} == MUL
    verdict = queue_report(second, url, "pr-7")
    assert verdict.returncode == 0, verdict.stdout + verdict.stderr
    assert "devpool select: 2 of 7 selected (baseline " in verdict.stdout, verdict.stdout
    assert len(sql(url, "SELECT 1 FROM devpool_history.select_generations")) == 1
    # Where auto selects, a database away gives a full run and says why, as `on` does.
    port = sql(url, "SELECT inet_server_port()")[0][0]
    away = url.replace(f":{port}/", f":{free_port()}/")
    run = Session(second, tmp_path, "away", f"--devpool-history={away}", "--devices", "sim:0-7",
                  "--devpool-select", "auto")  # fmt: skip
    assert run.done.returncode == 0, run.output
    assert run.select["full_run"] is True and "cannot reach PostgreSQL" in run.select["reason"]
    assert run.ran == {*MATH_IDS, *DATA_IDS} and "Traceback" not in run.output


def test_a_queue_run_on_runners_of_two_sizes_publishes_a_generation_for_each(
    postgres: Any, tmp_path: Path
) -> None:
    """A 2-device job records what it can hold and ends; an 8-device job runs the rest
    (test_eight) and publishes: runners of both sizes read the run's baseline."""
    url = database_of(postgres)
    first = git_project(tmp_path / "runner" / "x", PROJECT)
    outputs = []
    for devices in ("sim:0-1", "sim:0-7"):
        started = job(first, tmp_path, f"size{devices[-1]}", url, "sizes-1",
                      "--devpool-select=record", f"--devices={devices}")  # fmt: skip
        outputs.append(started.communicate(timeout=240)[0])
        assert started.returncode == 0, outputs[-1]
    assert "for runners of 2 devices and 8 devices" in outputs[-1], outputs
    rows = sql(url, "SELECT manifest FROM devpool_history.select_generations ORDER BY id")
    manifests = [json.loads(row[0]) for row in rows]
    assert sorted(m["shape"]["pool"] for m in manifests) == [2, 8]
    assert {m["db_sha256"] for m in manifests} == {manifests[0]["db_sha256"]}  # one database
    second = clone(first, tmp_path / "home" / "x")
    turn_mul(second)
    history = f"--devpool-history={url}"
    for devices in ("sim:0-1", "sim:0-7"):
        run = Session(second, tmp_path, f"on{devices[-1]}", history, "--devpool-select", "on",
                      "--devices", devices)  # fmt: skip
        assert run.select["full_run"] is False and run.ran == MUL, run.output
