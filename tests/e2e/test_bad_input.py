"""End to end: mistakes a new user makes, each typed as a user would (issue 30).

Every row runs the real command in a subprocess (`python -m pytest ...` or the `devpool`
command) and checks what the user sees: exit status 4 (pytest's usage error, or
devpool's), one sentence that names what was wrong, and no traceback. Rows share one
folder of small projects and run side by side, and pytest starts with only devpool's
plugin, so the table is fast.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

PYTEST = (sys.executable, "-m", "pytest", "-p", "devpool.plugin", "-p", "no:cacheprovider")
DEVPOOL = (sys.executable, "-c", "import sys; from devpool.cli import main; sys.exit(main())")
BASE = '[tool.pytest.ini_options]\ntestpaths = ["tests"]\n'
TESTS = (
    "import pytest\n\n@pytest.mark.device_count(1)\ndef test_one(): pass\n\ndef test_cpu(): pass\n"
)
SIM = ("--devices", "sim:0-1")


@dataclass(frozen=True)
class Mistake:
    """One row: what the user typed, in which project, and what names the mistake."""

    id: str
    args: tuple[str, ...]  # after `python -m pytest` or `devpool`; {root}: the project
    says: tuple[str, ...]  # each must be in the one line of error
    devpool: bool = False  # the `devpool` command, else pytest
    toml: str = ""  # added to pyproject.toml
    tests: str = TESTS
    env: dict[str, str] = field(default_factory=dict)
    code: int = 4
    unless: str = ""  # a tool whose presence makes this no mistake (nvidia-smi: a real card)


def pytest_row(id: str, *args: str, says: tuple[str, ...] | str, **kw: Any) -> Mistake:
    said = (says,) if isinstance(says, str) else says
    return Mistake(f"option-{id}", (*SIM, *args), said, **kw)


def toml_row(id: str, toml: str, says: tuple[str, ...] | str, **kw: Any) -> Mistake:
    said = (says,) if isinstance(says, str) else says
    return Mistake(f"toml-{id}", SIM, said, toml=toml, **kw)


def marker_row(id: str, markers: str, says: tuple[str, ...] | str) -> Mistake:
    said = (says,) if isinstance(says, str) else says
    tests = f"import pytest\n\n{markers}\ndef test_marked(): pass\n"
    return Mistake(f"marker-{id}", SIM, ("test_marked", *said), tests=tests)


def cli_row(id: str, *args: str, says: tuple[str, ...] | str, **kw: Any) -> Mistake:
    said = (says,) if isinstance(says, str) else says
    return Mistake(f"devpool-{id}", args, said, devpool=True, **kw)


OPTIONS = [
    pytest_row("run-dir-in-proc", "--devpool-run-dir=/proc/devpool-run", says="/proc/devpool-run"),
    pytest_row("run-record-in-proc", "--devpool-run-record=/proc/x/r.jsonl", says="/proc/x"),
    pytest_row("run-dir-is-a-file", "--devpool-run-dir={root}/pyproject.toml", says="is a file"),
    pytest_row("run-record-is-a-folder", "--devpool-run-record={root}/tests", says="is a folder"),
    pytest_row("lock-dir-in-proc", "--devpool-lock-dir=/proc/devpool-locks", says="not writable"),
    pytest_row("lock-dir-is-a-file", "--devpool-lock-dir={root}/pyproject.toml", says="lock"),
    pytest_row(
        "option-misspelt",
        "--devpool-max-paralel",
        "4",
        says="did you mean --devpool-max-parallel?",
    ),
    pytest_row("option-underscored", "--devpool-max_parallel=4", says="--devpool-max-parallel"),
    pytest_row("option-unknown", "--devpool-frobnicate", says="--devpool-frobnicate"),
    pytest_row("max-parallel-zero", "--devpool-max-parallel=0", says="--devpool-max-parallel"),
    pytest_row("max-parallel-word", "--devpool-max-parallel=two", says="whole number"),
    pytest_row("cpu-slots-zero", "--devpool-cpu-slots=0", says="--devpool-cpu-slots"),
    pytest_row("lease-timeout-negative", "--devpool-lease-timeout=-1", says="seconds > 0"),
    pytest_row("test-timeout-zero", "--devpool-test-timeout=0", says="--devpool-test-timeout"),
    pytest_row("start-timeout-word", "--devpool-worker-start-timeout=x", says="seconds"),
    pytest_row("timeout-grace-zero", "--devpool-timeout-grace=0", says="--devpool-timeout-grace"),
    pytest_row("isolation-unknown", "--devpool-isolation=process", says="'module'"),
    pytest_row("ports-backwards", "--devpool-ports=20010-20000", says="ports"),
    pytest_row("ports-word", "--devpool-ports=many", says="ports"),
    pytest_row("ports-ephemeral", "--devpool-ports=40000-40100", says="ephemeral"),
    pytest_row("device-memory-unit", "--devpool-device-memory=8XB", says="--devpool-device-memory"),
    pytest_row("memory-reserve-over", "--devpool-memory-reserve=150%", says="memory-reserve"),
    pytest_row("reruns-negative", "--devpool-reruns=-1", says="--devpool-reruns"),
    pytest_row("reruns-delay-negative", "--devpool-reruns-delay=-2", says="--devpool-reruns-delay"),
    pytest_row("reruns-infra-word", "--devpool-reruns-infra=x", says="--devpool-reruns-infra"),
    pytest_row("flaky-result-maybe", "--devpool-flaky-result=maybe", says="'pass'"),
    pytest_row("repeat-zero", "--devpool-repeat=0", says="--devpool-repeat"),
    pytest_row("default-estimate-zero", "--devpool-default-estimate=0", says="estimate"),
    pytest_row("shard-past-the-end", "--devpool-shard=3/2", says="3/2"),
    pytest_row("shard-word", "--devpool-shard=half", says="half"),
    pytest_row("backend-unknown", "--devpool-backend=k8s", says="'ray'"),
    pytest_row("select-mode-unknown", "--devpool-select=always", says="'record'"),
    pytest_row("keep-runs-zero", "--devpool-keep-runs=0", says="--devpool-keep-runs"),
    pytest_row("profile-undefined", "--devpool-profile=nightly", says="'nightly'"),
    pytest_row("flag-both-ways", "--devpool-github", "--devpool-no-github", says="contradict"),
    pytest_row("history-is-a-folder", "--devpool-history={root}/tests", says="is a folder"),
    pytest_row("quarantine-file-is-a-folder", "--devpool-quarantine-file={root}", says="directory"),
    pytest_row("peer-service-empty", "--devpool-peer-service=", says="--devpool-peer-service"),
    pytest_row("profile-empty", "--devpool-profile=", says="--devpool-profile"),
    Mistake("option-devices-empty", ("--devices=",), ("--devices",)),
    Mistake(
        "option-devices-ids-outside-visible",
        ("--devices", "4-5"),
        ("--devices 4-5 asks for devices 4,5 that CUDA_VISIBLE_DEVICES=0,1 hides",),
        env={"CUDA_VISIBLE_DEVICES": "0,1"},
    ),
    Mistake(
        "option-devices-ids-no-accelerator",
        ("--devices", "0-1"),
        ("--devices 0-1 gives device ids without a platform", "--devices sim:0-1"),
        unless="nvidia-smi",
    ),
    pytest_row("ray-address-on-local", "--devpool-ray-address=auto", says="--devpool-backend ray"),
    pytest_row("ray-ship-code-on-local", "--devpool-ray-ship-code", says="--devpool-backend ray"),
    pytest_row("shard-by-module-alone", "--devpool-shard-by-module", says="--devpool-shard K/N"),
    pytest_row("xdist-n", "-p", "xdist", "-n", "2", says="-n"),
    pytest_row("xdist-dist-loadfile", "-p", "xdist", "--dist", "loadfile", says="--dist loadfile"),
    pytest_row(
        "quarantine-file-missing", "--devpool-quarantine-file=/nonexistent.toml", says="quarantine"
    ),
    pytest_row(
        "spaced-path-moves-rootdir",
        "--devpool-lock-dir",
        "{root}/other",
        says="--devpool-lock-dir=DIR",
    ),
    Mistake("option-devices-unknown-platform", ("--devices", "tpu:0-1"), ("tpu",)),
    Mistake("option-devices-backwards", ("--devices", "sim:1-0"), ("sim:1-0",)),
    Mistake("option-devices-twice", ("--devices", "sim:0,0"), ("0,0",)),
    Mistake("option-devices-empty-ids", ("--devices", "sim:"), ("'sim:'",)),
    Mistake("option-devices-negative", ("--devices", "sim:-1"), ("'sim:-1'",)),
    Mistake(
        "option-devices-no-such-card",
        ("--devices", "cuda:0"),
        ("cuda:0", "sim"),
        unless="nvidia-smi",
    ),
]

TABLES = [
    toml_row("key-misspelt", "[tool.devpool]\nmax_paralel = 4\n", "did you mean max-parallel?"),
    toml_row("key-unknown", "[tool.devpool]\nspeed = 4\n", ("'speed'", "known keys")),
    toml_row("select-key", "[tool.devpool.select]\nignores = []\n", "did you mean ignore?"),
    toml_row(
        "profile-key", "[tool.devpool.profiles.ci]\nretries = 2\n", "[tool.devpool.profiles.ci]"
    ),
    toml_row(
        "profile-key-misspelt",
        "[tool.devpool.profiles.nightly]\nrerun = 2\n",
        ("[tool.devpool.profiles.nightly]", "did you mean reruns?"),
    ),
    toml_row(
        "profile-value-under-ci",
        '[tool.devpool.profiles.ci]\nreruns = "two"\n',
        "[tool.devpool.profiles.ci] reruns",
        env={"CI": "true"},
    ),
    toml_row(
        "platform-key",
        '[tool.devpool.platforms.npu2]\nkind = "sim"\nmemroy = "8GiB"\n',
        ("[tool.devpool.platforms.npu2]", "did you mean memory?"),
    ),
    toml_row("platform-kind", '[tool.devpool.platforms]\nnpu2 = "asend"\n', "did you mean ascend?"),
    toml_row("platform-entry", "[tool.devpool.platforms]\nnpu2 = 7\n", "npu2"),
    toml_row("platform-name", '[tool.devpool.platforms]\n"1npu" = "sim"\n', "'1npu'"),
    toml_row("platform-auto", '[tool.devpool.platforms]\nauto = "sim"\n', "reserved"),
    toml_row("resource-zero", "[tool.devpool.resources]\nhccl = 0\n", "hccl"),
    toml_row("resource-name", '[tool.devpool.resources]\n"a b" = 1\n', "'a b'"),
    toml_row("devices-number", "[tool.devpool]\ndevices = 5\n", "devices must be a string"),
    toml_row("max-parallel-zero", "[tool.devpool]\nmax-parallel = 0\n", "max-parallel"),
    toml_row("isolation", '[tool.devpool]\nisolation = "proc"\n', "isolation"),
    toml_row("fork-server-text", '[tool.devpool]\nfork-server = "yes"\n', "true or false"),
    toml_row("profiles-not-tables", "[tool.devpool]\nprofiles = 3\n", "[tool.devpool.profiles]"),
    toml_row("profile-undefined", '[tool.devpool]\nprofile = "nightly"\n', "'nightly'"),
    toml_row("select-mode", '[tool.devpool]\nselect = "sometimes"\n', "select"),
    toml_row("select-age", "[tool.devpool.select]\nmax-age-days = -1\n", "max-age-days"),
    toml_row("select-inputs", '[tool.devpool.select]\ninputs = "a.txt"\n', "inputs"),
    toml_row("quarantine-not-table", "[tool.devpool]\nquarantine = 3\n", "quarantine"),
    toml_row("fatal-patterns-not-table", '[tool.devpool]\nfatal-patterns = "x"\n', "fatal"),
    toml_row("toml-broken", "[tool.devpool\nmax-parallel = 4\n", "pyproject.toml"),
    toml_row("ports-ephemeral", '[tool.devpool]\nports = "40000-40100"\n', "ephemeral"),
]

MARKERS = [
    marker_row("device-count-zero", "@pytest.mark.device_count(0)", "device_count(0)"),
    marker_row("device-count-text", '@pytest.mark.device_count("2")', "device_count('2')"),
    marker_row(
        "device-count-twice",
        "@pytest.mark.device_count(1)\n@pytest.mark.device_count(2)",
        "conflicting @pytest.mark.device_count",
    ),
    marker_row("timeout-twice", "@pytest.mark.timeout(5)\n@pytest.mark.timeout(9)", "conflicting"),
    marker_row("device-memory-unit", '@pytest.mark.device_memory("8XB")', "device_memory"),
    marker_row(
        "memory-and-exclusive",
        '@pytest.mark.device_memory("1GiB")\n@pytest.mark.device_exclusive',
        "contradict",
    ),
    marker_row("platforms-empty", "@pytest.mark.platforms([])", "platforms"),
    marker_row("platforms-unknown", '@pytest.mark.platforms(["tpu"])', "'tpu'"),
    marker_row("timeout-negative", "@pytest.mark.timeout(-1)", "timeout(-1)"),
    marker_row("timeout-text", '@pytest.mark.timeout("5")', "timeout('5')"),
    marker_row("nodes-zero", "@pytest.mark.nodes(0)", "nodes(0)"),
    marker_row("nodes-peer-service", "@pytest.mark.nodes(2, peer_service=3)", "peer_service"),
    marker_row("ports-zero", "@pytest.mark.ports(0)", "ports(0)"),
    marker_row("resources-undeclared", "@pytest.mark.resources(hccl=1)", "'hccl'"),
    marker_row("resources-positional", '@pytest.mark.resources("hccl")', "name=count"),
    marker_row("isolate-true", "@pytest.mark.isolate(True)", "isolate takes no arguments"),
    Mistake(
        "marker-ports-fixture-without-ports",
        SIM,
        ("test_marked", "devpool_ports", "@pytest.mark.ports(1)"),
        tests="import pytest\n\n@pytest.mark.device_count(1)\n"
        "def test_marked(devpool_ports): pass\n",
    ),
    marker_row("isolate-false", "@pytest.mark.isolate(False)", "isolate(False)"),
    marker_row("exclusive-true", "@pytest.mark.device_exclusive(True)", "device_exclusive"),
]

COMMANDS = [
    cli_row("serve-port-too-big", "serve", "--port", "99999", says="--port"),
    cli_row("serve-port-word", "serve", "--port", "http", says="--port"),
    cli_row("serve-port-taken", "serve", "--port", "{taken}", says=("{taken}", "in use")),
    cli_row("serve-missing-folder", "serve", "/tmp/nosuch/.devpool", says="/tmp/nosuch/.devpool"),
    cli_row("serve-missing-lock-dir", "serve", "--lock-dir", "/no/such", says="/no/such"),
    cli_row("serve-lock-dir-a-file", "serve", "--lock-dir", "{root}/pyproject.toml", says="not a"),
    cli_row("serve-open-without-token", "serve", "--host", "0.0.0.0", says="--token"),
    cli_row("locks-missing-folder", "locks", "--lock-dir", "/nonexistent", says="does not exist"),
    cli_row("locks-on-a-file", "locks", "--lock-dir", "{root}/pyproject.toml", says="not a folder"),
    cli_row("doctor-missing-folder", "doctor", "--lock-dir", "/nonexistent", says="/nonexistent"),
    cli_row("doctor-timeout-word", "doctor", "--timeout", "soon", says="--timeout"),
    cli_row("locks-bad-toml", "locks", says="not valid TOML", toml="[tool.devpool\n"),
    cli_row("command-unknown", "frobnicate", says="frobnicate"),
    cli_row("command-abbreviated", "loc", says="loc"),
    cli_row("option-abbreviated", "locks", "--lock", "x", says="--lock"),
    cli_row("report-missing-record", "report", "/nonexistent.jsonl", says="/nonexistent.jsonl"),
    cli_row("report-format", "report", "--format", "xml", says="--format"),
    cli_row("capacity-history-missing", "capacity", "--history", "/nonexistent", says="--history"),
    cli_row("capacity-platform", "capacity", "--platform", "tpu", says="'tpu'"),
    cli_row(
        "capacity-devpool-option",
        "capacity",
        "--",
        "--devpool-max-paralel",
        "4",
        says="did you mean --devpool-max-parallel?",
    ),
    cli_row("capacity-pytest-option", "capacity", "--frob", says="after `--`"),
    cli_row("shard-without-size", "shard", says="--runners"),
    cli_row("shard-zero-runners", "shard", "--runners", "0", says="--runners"),
    cli_row("shard-budget-word", "shard", "--budget", "soon", says="'soon'"),
    cli_row(
        "shard-per-runner-zero",
        "shard",
        "--runners",
        "2",
        "--devices-per-runner",
        "0",
        says="--devices-per-runner",
    ),
    cli_row("shard-verify-nothing", "shard", "verify", says="RECORD"),
    cli_row("shard-verify-missing", "shard", "verify", "/nonexistent.jsonl", says="/nonexistent"),
    cli_row(
        "select-import-missing", "select", "import", "/nonexistent.tar.gz", says="/nonexistent"
    ),
    cli_row("select-export-nothing", "select", "export", "{root}/b.tar.gz", says="no baseline"),
    cli_row(
        "select-bad-key",
        "select",
        says="did you mean ignore?",
        toml="[tool.devpool.select]\nignores = []\n",
    ),
    cli_row(
        "select-bad-top-key",
        "select",
        says="did you mean max-parallel?",
        toml="[tool.devpool]\nmax_paralel = 2\n",
    ),
    cli_row(
        "locks-bad-profile-key",
        "locks",
        says="[tool.devpool.profiles.nightly]",
        toml="[tool.devpool.profiles.nightly]\nlock_dirr = 'x'\n",
    ),
    cli_row(
        "run-misspelt-option",
        "run",
        "--",
        *PYTEST,
        *SIM,
        "--devpool-max-paralel",
        "4",
        says="did you mean --devpool-max-parallel?",
    ),
    cli_row("history-unknown-action", "history", "frob", says="frob"),
    cli_row("report-slower-without-diff", "report", "--slower", "3", says=("--slower", "--diff")),
]

ROWS = [*OPTIONS, *TABLES, *MARKERS, *COMMANDS]


@pytest.fixture(scope="module")
def projects(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for every row's small project; a row makes its own below it."""
    return tmp_path_factory.mktemp("bad-input")


@pytest.fixture(scope="module")
def taken_port() -> Iterator[int]:
    """A port something else already listens on, for `devpool serve --port`."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def environment(extra: dict[str, str]) -> dict[str, str]:
    """The user's environment without CI markers or devpool's own variables."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GITHUB_", "DEVPOOL_", "PYTEST_")) and k != "CI"
    }
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return {**env, **extra}


def project(projects: Path, row: Mistake) -> Path:
    root = projects / row.id
    (root / "tests").mkdir(parents=True)
    (root / "other").mkdir()
    (root / "other" / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    (root / "pyproject.toml").write_text(BASE + row.toml)
    (root / "tests" / "test_x.py").write_text(row.tests)
    return root


def one_sentence(output: str) -> str:
    """The error line of what the user saw; asserts there is exactly one, and no traceback."""
    assert "Traceback" not in output and "INTERNALERROR" not in output, output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    return lines[0]


def run_row(row: Mistake, projects: Path, taken_port: int) -> subprocess.CompletedProcess[str]:
    """Run one row's command as the user typed it, in a project of its own."""
    root = project(projects, row)
    command = DEVPOOL if row.devpool else PYTEST
    return subprocess.run(
        [*command, *(filled(a, root, taken_port) for a in row.args)],
        cwd=root,
        env=environment(row.env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def filled(text: str, root: Path, taken_port: int) -> str:
    return text.replace("{root}", str(root)).replace("{taken}", str(taken_port))


@pytest.fixture(scope="module")
def seen(
    request: pytest.FixtureRequest, projects: Path, taken_port: int
) -> dict[str, tuple[Path, subprocess.CompletedProcess[str]]]:
    """Every selected row, run side by side (each is a short process that mostly waits to
    start): row id → (its project, what the user saw). An xdist worker runs its own
    share row by row instead (it collects every row, but runs only some)."""
    if hasattr(request.config, "workerinput"):
        return {}
    wanted = [
        item.callspec.params["row"]
        for item in request.session.items
        if hasattr(item, "callspec") and isinstance(item.callspec.params.get("row"), Mistake)
    ]
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        runs = {row.id: pool.submit(run_row, row, projects, taken_port) for row in wanted}
        return {key: (projects / key, run.result()) for key, run in runs.items()}


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_a_mistake_gets_one_sentence_and_exit_4(
    row: Mistake,
    seen: dict[str, tuple[Path, subprocess.CompletedProcess[str]]],
    projects: Path,
    taken_port: int,
) -> None:
    if row.unless and shutil.which(row.unless):
        pytest.skip(f"{row.unless} is here: {row.args} is no mistake on this host")
    if row.id not in seen:
        seen[row.id] = (projects / row.id, run_row(row, projects, taken_port))
    root, done = seen[row.id]
    output = done.stdout + done.stderr
    assert done.returncode == row.code, output
    assert "Traceback" not in done.stdout and "INTERNALERROR" not in done.stdout, output
    line = one_sentence(done.stderr)
    if row.devpool:
        assert done.stdout == "", output  # the sentence comes first, nothing before it
    assert "devpool serve:" not in done.stdout  # no banner for a server that never listened
    if not row.devpool:
        assert line.startswith("ERROR: "), line  # pytest's form of a usage error
    for needle in row.says:
        assert filled(needle, root, taken_port) in line, line


def test_a_spaced_path_option_that_moved_nothing_is_accepted(projects: Path) -> None:
    row = Mistake("accepted-spaced-path", (), ())
    root = project(projects, row)
    args = [*PYTEST, *SIM, "--devpool-lock-dir", str(root / "locks"), "-q"]
    for _ in ("before the folder is made", "once it is there"):  # both runs agree
        done = subprocess.run(
            args, cwd=root, env=environment({}), capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert any((root / "locks").iterdir())  # the value reached the option


def test_markers_at_class_and_function_keep_closest_wins(projects: Path) -> None:
    tests = (
        "import pytest\n\n@pytest.mark.device_count(2)\nclass TestPair:\n"
        "    @pytest.mark.device_count(1)\n    def test_one(self): pass\n\n"
        "    def test_two(self): pass\n"
    )
    root = project(projects, Mistake("accepted-closest-wins", (), (), tests=tests))
    done = subprocess.run(
        [*PYTEST, *SIM, "--devpool-plan"],
        cwd=root,
        env=environment({}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    plan = done.stdout
    assert "test_one" in plan and "test_two" in plan, plan


def test_devpool_into_a_closed_pipe_ends_quietly(projects: Path) -> None:
    """`devpool select --explain tests | head`: the reader left; no traceback, as git."""
    root = project(projects, Mistake("closed-pipe", (), ()))
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line
    try:
        done = subprocess.run(
            [*DEVPOOL, "select", "--explain", "tests"],
            cwd=root,
            env=environment({}),
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write)
    assert done.stderr == ""
    assert done.returncode == 141  # 128 + SIGPIPE, what `git log | head` leaves


def test_devpool_options_without_devices_are_named_as_idle(projects: Path) -> None:
    root = project(projects, Mistake("idle-options", (), ()))
    done = subprocess.run(
        [*PYTEST, "--devpool-max-parallel=3", "--devpool-reruns=2", "-q"],
        cwd=root,
        env=environment({}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    idle = "devpool: off: --devpool-max-parallel, --devpool-reruns have no effect without --devices"
    assert idle in done.stdout.splitlines()


def test_there_are_at_least_eighty_rows() -> None:
    assert len(ROWS) >= 80
    assert len({row.id for row in ROWS}) == len(ROWS)
