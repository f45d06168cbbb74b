"""Every code block of the newcomer's pages runs as shown (issue 46).

getting-started, adopting, ci and reports were tried page by page by a new user: a command
that failed as written, a sample output nobody could get, a test that died with a KeyError.
Here each `bash` line of those pages runs in a scratch project (on eight fake CUDA cards
where it says `auto` or `cuda`), each workflow's install step is checked against its
checkout, each `toml` block is read as devpool reads pyproject.toml, and the install and
the demo run in a fresh virtual environment on a fresh clone, against the page's sample.
A line that cannot run here is listed below with what runs it instead.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from devpool.cli import parse
from devpool.config import OPTIONS, check_tables, settings_from

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

yaml = pytest.importorskip("yaml", reason="PyYAML comes with mkdocs, in the [dev] extra")

ROOT = Path(__file__).resolve().parent.parent
PAGES = ("getting-started", "adopting", "ci", "reports")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)

# Lines that need more than a scratch project, and where they run instead.
ELSEWHERE = {
    "pip install -e . && python -m pytest examples --devices sim:0-7": "fresh venv test",
    "pip install -e '.[dev]' && python -m pytest tests": "the whole suite: .ci/run runs it",
    "pip install ../devpool": "fresh venv test",
    "pip wheel --no-deps --wheel-dir wheels ../devpool": "fresh venv test",
    "pip install wheels/devpool-*.whl": "fresh venv test",
    "devpool adopt [PATHS] [--format text|markdown|json] [-- pytest options]": "a synopsis",
    "devpool rerun ci-run/ -- tests --devices auto -x": "a run folder downloaded from CI",
}

# Eight idle 80 GiB GPUs, as nvidia-smi's CSV queries answer them.
NVIDIA_SMI = """#!/bin/sh
for i in 0 1 2 3 4 5 6 7; do
  case "$*" in
    *index,pci.bus_id*) echo "$i, 00000000:0$i:00.0" ;;
    *query-compute-apps*) ;;
    *index,memory.total*) echo "$i, 81559" ;;
    *index,uuid*) echo "$i, GPU-0000000$i" ;;
    *query-gpu=index*) echo "$i" ;;
    *) exit 1 ;;
  esac
done
"""


def fenced(page: str) -> list[tuple[str, str]]:
    """(language, text) of every fenced block of docs/PAGE.md, in order."""
    text = (ROOT / "docs" / f"{page}.md").read_text(encoding="utf-8")
    return [(lang, body) for lang, body in FENCE.findall(text)]


def commands(page: str) -> list[str]:
    """The command lines of the page's bash blocks, without their trailing comments."""
    lines = []
    for lang, body in fenced(page):
        if lang != "bash":
            continue
        for line in body.splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


# adopting's suite before devpool: it passes in plain pytest, and under devpool.
PLAIN_SUITE = """
import os


def test_tokenizer():
    assert "".join(reversed("ab")) == "ba"


def test_sees_what_it_is_given():
    assert os.environ.get("CUDA_VISIBLE_DEVICES", "") in ("",) + tuple("01234567")
"""


def scratch_project(root: Path, locks: Path, page: str = "getting-started") -> dict[str, str]:
    """A suite as tests/ (getting-started's first, or a plain one for adopting), a lock
    folder of its own in pyproject.toml (the commands stay as shown), fake CUDA cards on
    PATH; the environment to run in."""
    example = next(body for lang, body in fenced("getting-started") if lang == "python")
    if page == "adopting":
        example = PLAIN_SUITE
    (root / "tests").mkdir(parents=True)
    (root / "tests" / "test_first.py").write_text(example, encoding="utf-8")
    (root / "pyproject.toml").write_text(f'[tool.devpool]\nlock-dir = "{locks}"\n')
    tools = root.parent / "fake-tools"
    tools.mkdir(exist_ok=True)
    (tools / "nvidia-smi").write_text(NVIDIA_SMI)
    (tools / "nvidia-smi").chmod(0o755)
    drop = ("GITHUB_", "DEVPOOL_", "PYTEST_ADDOPTS", "CI")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PATH"] = f"{tools}{os.pathsep}{env['PATH']}"
    return env


def shell(line: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", line],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,
    )


def _ok(done: subprocess.CompletedProcess[str], line: str) -> None:
    assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"


@pytest.mark.parametrize("page", PAGES)
def test_every_command_of_the_page_runs_as_shown(
    page: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    project = tmp_path / "project"
    env = scratch_project(project, tmp_path / "locks", page)
    env["GITHUB_STEP_SUMMARY"] = str(tmp_path / "step-summary.md")
    # What the page's commands read: a run behind them, the runs the report page names.
    setup = ["python -m pytest tests --devices sim:0-3"]
    if page == "reports":
        setup += [
            "python -m pytest tests --devices sim:0-3"
            " --devpool-run-dir=.devpool/runs/20261203-133633-10033",
            "python -m pytest tests --devices sim:0-3 --devpool-run-record=old/record.jsonl",
            "python -m pytest tests --devices sim:0-3 --devpool-run-record=new/record.jsonl",
        ]
    for line in setup:
        _ok(shell(line, project, env), line)
    lines = [line for line in commands(page) if line not in ELSEWHERE]
    assert lines, f"{page} has no command to run"
    if any("$FLEET" in line for line in lines):
        env["FLEET"] = request.getfixturevalue("postgres").url
    for line in lines:
        done = shell(line, project, env)
        _ok(done, line)
        if "devpool run --log=" in line:
            log = project / line.split("--log=")[1].split()[0]
            assert "devpool run: exit code 0" in log.read_text(encoding="utf-8")


def test_the_lines_run_elsewhere_are_on_the_pages() -> None:
    shown = {line for page in PAGES for line in commands(page)}
    assert set(ELSEWHERE) <= shown, set(ELSEWHERE) - shown


def _workflow_steps(page: str) -> list[tuple[str, list[dict[str, Any]]]]:
    jobs = []
    for lang, body in fenced(page):
        if lang != "yaml":
            continue
        data = yaml.safe_load(body)
        for name, job in (data.get("jobs") or {}).items():
            jobs.append((name, job["steps"]))
    return jobs


def test_every_workflow_installs_devpool_from_what_it_checked_out() -> None:
    """No package index has devpool: each `pip install` names it by the path a checkout
    step of the same job put it at."""
    jobs = _workflow_steps("ci")
    assert len(jobs) >= 5
    for name, steps in jobs:
        checked_out: set[str] = set()
        for step in steps:
            if step.get("uses", "").startswith("actions/checkout@"):
                checked_out.add((step.get("with") or {}).get("path", "."))
            run = step.get("run", "")
            if "pip install" not in run:
                continue
            words = shlex.split(run)
            named = [w for w in words if "devpool" in w]
            assert named, f"{name}: {run!r} installs no devpool"
            for word in named:
                path = re.sub(r"\[.*\]$", "", word)
                assert path.startswith("./"), f"{name}: {word!r} is not a path"
                assert path[2:] in checked_out, f"{name}: {path} was not checked out before"


def test_every_workflow_command_parses_as_devpool_reads_it(tmp_path: Path) -> None:
    """The devpool commands of every workflow step: known commands, options, --devpool-*."""
    for name, steps in _workflow_steps("ci"):
        for step in steps:
            run = re.sub(r"\$\{\{[^}]*\}\}", "1", step.get("run", ""))
            words = shlex.split(run)
            if words[:1] == ["devpool"]:
                parse(words[1:])  # exits (a failure here) on an unknown command or option
            if "--devpool-" in run or "--devices" in run:
                known = {o.cli for o in OPTIONS} | {"--devices"}
                given = {w.split("=")[0] for w in words if w.startswith("--dev")}
                assert given <= known, f"{name}: {given - known}"


@pytest.mark.parametrize("page", PAGES)
def test_every_toml_block_is_read_as_devpool_reads_pyproject(page: str) -> None:
    blocks = [body for lang, body in fenced(page) if lang == "toml"]
    for body in blocks:
        data = tomllib.loads(body)
        table = data.get("tool", {}).get("devpool", {})
        assert table, body
        check_tables(table, f"docs/{page}.md")
        settings_from({}, table, f"docs/{page}.md", {})


@pytest.mark.parametrize("page", [*PAGES, "markers"])
def test_every_sample_session_prints_what_the_page_shows(page: str, tmp_path: Path) -> None:
    """A `text` block that starts with `$ COMMAND`: the command, run on getting-started's
    suite, prints the block's lines, in that order (other lines may come between)."""
    samples = [body for lang, body in fenced(page) if lang == "text" and body.startswith("$ ")]
    project = tmp_path / "project"
    env = scratch_project(project, tmp_path / "locks")
    # pytest-randomly comes with devpool's [dev] tools only: a user's plan is in their order.
    env["PYTEST_ADDOPTS"] = "-p no:randomly"
    for sample in samples:
        command, *shown = sample.rstrip("\n").splitlines()
        done = shell(command[2:], project, env)
        _ok(done, command)
        printed = iter(done.stdout.splitlines())
        for line in shown:
            assert any(row.rstrip() == line.rstrip() for row in printed), (line, done.stdout)
    assert samples or page != "markers"


@pytest.mark.parametrize("page", [*PAGES, "markers", "distributed"])
def test_every_python_block_compiles(page: str) -> None:
    for body in [body for lang, body in fenced(page) if lang == "python"]:
        compile(body, f"docs/{page}.md", "exec")


def test_the_docs_extra_is_the_docs_part_of_dev() -> None:
    """`pip install -e '.[docs]'` for mkdocs serve: the same pins as [dev], nothing else."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert extras["docs"] and set(extras["docs"]) <= set(extras["dev"])
    assert {pin.split("==")[0] for pin in extras["docs"]} == {"mkdocs", "mkdocs-material"}


def _fresh_venv(where: Path) -> dict[str, str]:
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=300)
    drop = ("GITHUB_", "DEVPOOL_", "PYTEST_", "CI", "VIRTUAL_ENV", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PATH"] = f"{where / 'bin'}{os.pathsep}{env['PATH']}"
    env["VIRTUAL_ENV"] = str(where)
    return env


def test_the_install_and_the_demo_work_in_a_fresh_venv_on_a_fresh_clone(tmp_path: Path) -> None:
    """adopting's installs (a path, a wheel) and getting-started's demo with its sample."""
    clone = tmp_path / "devpool"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=300)
    project = tmp_path / "project"
    scratch_project(project, tmp_path / "locks", "adopting")

    blocks = [body for lang, body in fenced("adopting") if lang == "bash"]
    by_path, by_wheel = blocks[0], blocks[1]
    assert "pip install ../devpool" in by_path and "pip wheel" in by_wheel
    for body, venv in ((by_path, tmp_path / "venv-path"), (by_wheel, tmp_path / "venv-wheel")):
        env = _fresh_venv(venv)
        for line in commands_of(body):
            _ok(shell(line, project, env), line)
        # devpool is there as a pytest plugin, without the [dev] tools.
        listed = shell("pip list --format=freeze", project, env).stdout
        assert "devpool==" in listed and "pytest-randomly" not in listed, listed

    # The git URL form the page gives in words, with the clone's URL.
    env = _fresh_venv(tmp_path / "venv-git")
    line = f"pip install git+file://{clone}"
    _ok(shell(line, project, env), line)
    _ok(shell("python -m pytest tests", project, env), "python -m pytest tests")
    assert "pip install git+URL" in (ROOT / "docs" / "adopting.md").read_text()

    # getting-started's demo, as shown, in a fresh venv without torch; then its sample.
    env = _fresh_venv(tmp_path / "venv-demo")
    (line,) = [c for c in commands("getting-started") if "examples" in c]
    # The demo's lock folder is the host's: a run of this test may wait for another's.
    demo = shell(line, clone, env)
    _ok(demo, line)
    sample = next(body for lang, body in fenced("getting-started") if lang == "text")

    def stable(text: str) -> list[str]:
        """The rows a run repeats: the counts (without the time or the rule's width), the
        progress row as its letters (their order is the order tests ended), the deselected."""
        kept = []
        for row in text.splitlines():
            if row.startswith("="):
                kept.append(re.sub(r" in [\d.]+s$", "", row.strip("= ")))
            elif row.startswith(("collected", "examples/", "---")):
                kept.append(row.rstrip())
            elif row.strip() and set(row) <= set(".sF[]%0123456789 "):
                kept.append("".join(sorted(row.split("[")[0].strip())))
        return kept

    assert stable(sample) == stable(demo.stdout)[-len(stable(sample)) :], demo.stdout


def commands_of(body: str) -> list[str]:
    return [
        re.sub(r"\s+#\s.*$", "", line).strip()
        for line in body.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
