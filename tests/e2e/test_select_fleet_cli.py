"""End to end: `devpool select`, `select export` and `select import` on a fleet's baselines in
PostgreSQL (issue 48): a person on any runner reads what the runs read, and moves baselines
between a database and files either way.

The expected selections come from real `--devpool-select on` runs in the same test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from select_project import PROJECT, git_project
from test_select_fleet import EIGHT, MUL, Session, clone, database_of, sql, turn_mul

from devpool.select.store_pg import PgStore

pytestmark = pytest.mark.usefixtures("selective_env")

DEVPOOL = "import sys; from devpool.cli import main; sys.exit(main(sys.argv[1:]))"
GENERATIONS = "SELECT generation FROM devpool_history.select_generations ORDER BY id"


def devpool(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", DEVPOOL, *args],
        cwd=root, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def selected(done: subprocess.CompletedProcess[str]) -> set[str]:
    """The node ids `devpool select` lists as selected."""
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    return {line.split()[1].rstrip(":") for line in lines if line.startswith("selected ")}


def same_as_the_run(done: subprocess.CompletedProcess[str], run: Session, url: str) -> None:
    """`devpool select` chose the generation the run chose and selected what the run
    selected from it; the run also runs the tests its baseline does not hold."""
    assert run.select["full_run"] is False, run.output
    generation = run.select["generation"]
    assert f"(baseline {generation}," in done.stdout, done.stdout
    _, _, database = PgStore(url).generation(generation)
    held = set(json.loads(database)["tests"])
    assert selected(done) == run.ran & held and run.ran - held <= {EIGHT}, done.stdout


def recorded_at_two_shapes(postgres: Any, tmp: Path) -> tuple[str, Path]:
    """A database holding the baselines of a 2-device and then an 8-device runner."""
    url = database_of(postgres)
    first = git_project(tmp / "runner" / "x", PROJECT)
    for devices in ("sim:0-1", "sim:0-7"):
        done = Session(first, tmp, f"rec{devices[-1]}", f"--devpool-history={url}",
                       "--devpool-select", "record", "--devices", devices)  # fmt: skip
        assert done.done.returncode == 0, done.output
    return url, first


def test_devpool_select_reads_the_database_for_the_runner_shape_it_names(
    postgres: Any, tmp_path: Path
) -> None:
    url, first = recorded_at_two_shapes(postgres, tmp_path)
    second = clone(first, tmp_path / "home" / "ci" / "x")
    turn_mul(second)
    history = f"--devpool-history={url}"
    for devices in ("sim:0-1", "sim:0-7"):
        run = Session(second, tmp_path, f"on{devices[-1]}", history, "--devpool-select", "on",
                      "--devices", devices)  # fmt: skip
        said = devpool(second, "select", history, "--devices", devices, "--explain", "tests")
        same_as_the_run(said, run, url)
        other = "sim with 2 devices" if devices.endswith("7") else "sim with 8 devices"
        assert f"also has {other} (choose with --devices)" in said.stdout
        assert not (second / ".devpool" / "select").exists()
    # No --devices: the newest recorded shape (8 devices), and the other named.
    said = devpool(second, "select", history, "tests")
    assert selected(said) == MUL, said.stdout
    assert "runner shape sim with 8 devices (the newest recorded)" in said.stdout


def test_devpool_select_reads_the_database_and_shape_the_project_configures(
    postgres: Any, tmp_path: Path
) -> None:
    """[tool.devpool] history and devices say it as the run's options would."""
    url = database_of(postgres)
    configured = {
        **PROJECT,
        "pyproject.toml": f"""
            [tool.pytest.ini_options]
            pythonpath = ["."]

            [tool.devpool]
            history = "{url}"
            devices = "sim:0-7"
            """,
    }
    first = git_project(tmp_path / "x", configured)
    for devices in ("sim:0-7", "sim:0-1"):  # the 2-device runner's baseline is the newest
        done = Session(first, tmp_path, f"rec{devices[-1]}", "--devpool-select", "record",
                       "--devices", devices)  # fmt: skip
        assert done.done.returncode == 0, done.output
    second = clone(first, tmp_path / "home" / "x")
    turn_mul(second)
    said = devpool(second, "select", "tests")
    run = Session(second, tmp_path, "on", "--devpool-select", "on", "--devices", "sim:0-7")
    same_as_the_run(said, run, url)
    assert selected(said) == MUL
    assert "runner shape sim with 8 devices ([tool.devpool] devices)" in said.stdout, said.stdout


def test_baselines_move_from_a_database_to_files_and_to_another_database(
    postgres: Any, tmp_path: Path
) -> None:
    url, first = recorded_at_two_shapes(postgres, tmp_path)
    archive = tmp_path / "fleet.tar.gz"
    exported = devpool(first, "select", "export", str(archive), f"--devpool-history={url}")
    assert exported.returncode == 0, exported.stderr
    names = [row[0] for row in sql(url, GENERATIONS)]
    assert [line.split()[4] for line in exported.stdout.splitlines()] == names  # both shapes

    # into another fleet's database: a fresh checkout selects from it as from the first
    other = database_of(postgres)
    for said in ("imported baseline", "is already in"):
        done = devpool(first, "select", "import", str(archive), f"--devpool-history={other}")
        assert done.returncode == 0 and done.stdout.count(said) == 2, done.stdout + done.stderr
    assert [row[0] for row in sql(other, GENERATIONS)] == names
    second = clone(first, tmp_path / "home" / "x")
    turn_mul(second)
    on = ("--devpool-select", "on", "--devices", "sim:0-7")
    expected = Session(second, tmp_path, "first-db", f"--devpool-history={url}", *on)
    moved = Session(second, tmp_path, "other-db", f"--devpool-history={other}", *on)
    assert moved.select["full_run"] is False and moved.ran == expected.ran == MUL
    assert moved.select["generation"] == expected.select["generation"]

    # into a project's files, for a fleet without PostgreSQL
    imported = devpool(second, "select", "import", str(archive))
    assert imported.returncode == 0, imported.stderr
    from_files = Session(second, tmp_path, "files", *on)
    assert from_files.select["full_run"] is False and from_files.ran == MUL, from_files.output

    # a database that recorded since the archive was made keeps its newer baseline
    third = database_of(postgres)
    again = Session(first, tmp_path, "newer", f"--devpool-history={third}", "--devpool-select",
                    "record", "--devices", "sim:0-7")  # fmt: skip
    (newer,) = [e["generation"] for e in again.events if e["type"] == "select_baseline"]
    done = devpool(first, "select", "import", str(archive), f"--devpool-history={third}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("not imported: ") == 1 and "has a newer one" in done.stdout
    assert done.stdout.count("imported baseline") == 1  # the 2-device one: none newer there
    run = Session(second, tmp_path, "third", f"--devpool-history={third}", *on)
    assert run.select["generation"] == newer and run.ran == MUL, run.output


def test_the_select_commands_name_a_bad_database_or_shape_in_one_sentence(
    postgres: Any, tmp_path: Path
) -> None:
    url = database_of(postgres)
    root = git_project(tmp_path / "x", PROJECT)
    cases = {
        ("select", "--devpool-history=mysql://h/db"): "--devpool-history must be a file",
        ("select", f"--devpool-history={url}", "--devices", "sim"): "--devices sim names no",
        ("select", "export", "a.tar.gz", f"--devpool-history={url}"): "no baseline for any",
        ("select", "import", "none.tar.gz", f"--devpool-history={url}"): "none.tar.gz: no such",
        ("select", "merge", f"--devpool-history={url}", "--devpool-queue-run=q-1"): "not in shards",
    }
    # a queue run's parts, never published: merge is for shards, and says so
    from devpool.select.fleet import pack_part, pool_mark

    entry = {"outcome": "passed", "devices": 0, "recorded": True, "blocks": {}, "files": {}}
    PgStore(url).send_parts("q-1", pack_part(root, {"tests/t.py::t": entry}, pool_mark("sim", 2)))
    for args, said in cases.items():
        done = devpool(root, *args)
        assert done.returncode == 4, done.stdout + done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and said in lines[0], done.stderr
    recorded = Session(root, tmp_path, "rec", f"--devpool-history={url}", "--devpool-select",
                       "record")  # fmt: skip
    assert recorded.done.returncode == 0, recorded.output
    folder_missing = devpool(root, "select", "export", str(tmp_path / "no" / "a.tar.gz"),
                             f"--devpool-history={url}")  # fmt: skip
    assert folder_missing.returncode == 4, folder_missing.stdout + folder_missing.stderr
    assert folder_missing.stderr.startswith("devpool: error: cannot export to ")
    assert len(folder_missing.stderr.strip().splitlines()) == 1
    (root / "junk.tar.gz").write_bytes(b"not a tar")
    done = devpool(root, "select", "import", "junk.tar.gz", f"--devpool-history={url}")
    assert done.returncode == 4, done
    assert "junk.tar.gz is damaged or not a tar archive" in done.stderr, done
    # an unreachable database: `devpool select` says a full run, and why, as a run would
    away = devpool(root, "select", "--devpool-history=postgresql://devpool@127.0.0.1:1/x", "tests")
    assert away.returncode == 0, away.stderr
    assert "full run: " in away.stdout and "cannot reach PostgreSQL" in away.stdout, away.stdout
    assert "Traceback" not in away.stdout + away.stderr


@pytest.mark.parametrize("where", ["files", "database"])
def test_keep_bounds_the_generations_kept_in_files_and_in_the_database(
    where: str, postgres: Any, tmp_path: Path
) -> None:
    """[tool.devpool.select] keep = 2: a third recording drops the oldest, the newest stays."""
    url = database_of(postgres) if where == "database" else ""
    history = f'history = "{url}"' if url else ""
    project = {
        **PROJECT,
        "pyproject.toml": f"""
            [tool.pytest.ini_options]
            pythonpath = ["."]

            [tool.devpool]
            {history}
            [tool.devpool.select]
            keep = 2
            """,
    }
    root = git_project(tmp_path / "x", project)
    for n in range(3):
        done = Session(root, tmp_path, f"rec{n}", "--devpool-select", "record")
        assert done.done.returncode == 0, done.output
    if url:
        kept = [row[0] for row in sql(url, GENERATIONS)]
    else:
        kept = sorted(p.parent.name for p in root.glob(".devpool/select/*/*/manifest.json"))
    (newest,) = [e["generation"] for e in done.events if e["type"] == "select_baseline"]
    assert kept[-1] == newest and len(kept) == 2, kept
    turn_mul(root)
    run = Session(root, tmp_path, "on", "--devpool-select", "on")
    assert run.select["generation"] == kept[-1] and run.ran == MUL | {EIGHT}, run.output


def test_a_generation_a_selective_queue_run_pinned_outlives_keep(
    postgres: Any, tmp_path: Path
) -> None:
    """A pull request's queue run selects from the generation its first job chose; the merge
    queue recording twice meanwhile, with keep = 1, drops it only once the run is over."""
    url = database_of(postgres)
    root = git_project(tmp_path / "x", PROJECT)
    store = PgStore(url, keep=1)
    record = ("--devpool-history=" + url, "--devpool-select", "record")
    first = Session(root, tmp_path, "rec1", *record)
    rows = sql(url, "SELECT bucket, identity, generation FROM devpool_history.select_generations")
    ((bucket, key, generation),) = rows
    assert first.done.returncode == 0 and store.newest(bucket, key, pin="pr-1")[0] == generation
    manifest = json.loads(store.generation(generation)[1])
    empty = {"blocks": [], "files": [], "libs": [], "tests": {}}
    for _ in range(2):  # two recordings meanwhile; keep = 1
        store.write(manifest, empty)
    assert store.newest(bucket, key, pin="pr-1")[0] == generation  # the run's jobs still see it
    assert store.newest(bucket, key)[0] != generation  # a new run sees the newest
    kept = {row[0] for row in sql(url, GENERATIONS)}
    assert len(kept) == 2 and generation in kept
    # the run is over (its row forgotten): the next recording keeps `keep` only
    sql(url, "UPDATE devpool_history.select_runs SET made = now() - interval '2 days'")
    store.write(manifest, empty)
    assert len(sql(url, GENERATIONS)) == 1
