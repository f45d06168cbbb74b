"""select/children.py: what a process below a recording worker tells, and the worker's gathering.

Each test starts real Python processes under a folder made as a worker makes it, and
gathers as the worker does at a test's teardown.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devpool import procfs
from devpool.select import children

MODULE = """
def used():
    return open(DATA).read()


def unused():
    return 0
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "data.txt").write_text("x")
    (root / "mod.py").write_text(f"DATA = {str(root / 'data.txt')!r}\n" + MODULE)
    return root


def start(root: Path, folder: Path, code: str, env: dict[str, str] | None = None) -> int:
    """Run `python -c code` in root below the folder (as a test of the worker would); its code."""
    environ = dict(os.environ if env is None else env, PYTHONPATH=str(root))
    environ.setdefault(children.FOLDER, str(folder))
    done = subprocess.run(
        [sys.executable, "-c", f"import devpool, mod\n{code}"],
        cwd=root,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode


@pytest.fixture
def folder(project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A worker's folder, under a base of the test's own (a recording run around this test
    has the real base's folder of this pid)."""
    monkeypatch.delenv(children.FOLDER, raising=False)
    base = tmp_path / "base"
    monkeypatch.setattr(children, "BASE", base)
    return children.make_folder(project)


def test_a_process_tells_the_functions_it_ran_and_the_files_it_read(
    project: Path, folder: Path
) -> None:
    assert start(project, folder, "mod.used()") == 0
    gathered = children.gather(folder, since=time.time())
    assert gathered.why == ""
    assert gathered.spots == {("mod.py", 0), ("mod.py", 3)}  # its top level and used()
    assert list(gathered.files) == ["data.txt"]
    assert sorted(os.listdir(folder)) == ["root", "started"]  # what was told is taken


def test_a_fork_that_ends_with_os_exit_tells_too(project: Path, folder: Path) -> None:
    code = (
        "import os\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    mod.unused()\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
    )
    assert start(project, folder, code) == 0
    gathered = children.gather(folder, since=time.time())
    assert gathered.why == ""
    assert ("mod.py", 7) in gathered.spots  # unused(), in the fork alone


def test_a_killed_process_fails_the_test_closed_with_its_pid(project: Path, folder: Path) -> None:
    code = "import os, signal\nmod.used()\nos.kill(os.getpid(), signal.SIGKILL)"
    assert start(project, folder, code) == -signal.SIGKILL
    gathered = children.gather(folder, since=time.time())
    assert "ended before telling what it ran" in gathered.why
    assert gathered.spots == set()
    assert sorted(os.listdir(folder)) == ["root", "started"]


def test_a_process_still_running_fails_closed_and_tells_a_later_test(
    project: Path, folder: Path
) -> None:
    environ = dict(os.environ, PYTHONPATH=str(project), **{children.FOLDER: str(folder)})
    code = "import devpool, mod, sys\nmod.used()\nsys.stdin.read()"
    server = subprocess.Popen(
        [sys.executable, "-c", code], cwd=project, env=environ, stdin=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 30
        while f"{server.pid}.started" not in os.listdir(folder):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        began = time.monotonic()
        gathered = children.gather(folder, since=time.time() + 60)  # started before the test
        assert time.monotonic() - began < children.WAIT  # not waited for
        assert gathered.why == f"a process it started (pid {server.pid}) still runs"
    finally:
        assert server.stdin is not None
        server.stdin.close()
        server.wait(timeout=30)
    gathered = children.gather(folder, since=time.time())
    assert gathered.why == "" and ("mod.py", 3) in gathered.spots


WORKER = """
import json, os, shutil, subprocess, sys, time
from pathlib import Path
from devpool import procfs
from devpool.select import children
root = sys.argv[1]
folder = children.make_folder(Path(root))
own = {"PATH": os.environ["PATH"], "PYTHONPATH": root}
subprocess.run([sys.executable, "-c", "import devpool, mod; mod.used()"], env=own, check=True)
gathered = children.gather(folder, since=time.time())
shutil.rmtree(folder)
print(json.dumps({"why": gathered.why, "spots": sorted(gathered.spots)}))
"""


STOPPED = """
import signal, subprocess, sys, time
from pathlib import Path
code = "import mod\\nmod.used()\\nprint('up', flush=True)\\nimport time\\ntime.sleep(60)"
server = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
assert server.stdout.readline() == "up\\n"
server.terminate()
print(server.wait(timeout=30))
"""


def test_a_process_stopped_by_sigterm_tells_and_still_ends_by_the_signal(
    project: Path, folder: Path
) -> None:
    """A server a test stops with terminate(): it tells before it ends, and ends as it would
    with no recording run around it (the same exit status as plain Python's, run here)."""
    own = dict(os.environ, PYTHONPATH=str(project))
    own.pop(children.FOLDER, None)
    plain = subprocess.run(
        [sys.executable, "-c", STOPPED], cwd=project, env=own, capture_output=True, text=True
    )
    assert plain.returncode == 0, plain.stderr
    below = dict(own, **{children.FOLDER: str(folder)})
    # The server imports devpool only through the .pth a wheel installs; here, with an
    # editable install, sitecustomize does what the .pth would.
    site = project / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import devpool\n")
    below["PYTHONPATH"] = f"{project}:{site}"
    recorded = subprocess.run(
        [sys.executable, "-c", STOPPED], cwd=project, env=below, capture_output=True, text=True
    )
    assert recorded.returncode == 0, recorded.stderr
    assert recorded.stdout == plain.stdout  # -15: ended by the signal, as plain's server
    gathered = children.gather(folder, since=time.time())
    assert gathered.why == ""
    assert ("mod.py", 3) in gathered.spots  # used(), told by the server as it was stopped


def test_a_process_that_ignores_sigterm_keeps_it_ignored(project: Path, folder: Path) -> None:
    """An ignored SIGTERM (nohup, a shell's trap) is inherited as it was: no handler of ours."""
    code = (
        "import signal, devpool, mod\n"
        "assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN\n"
        "mod.used()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=project,
        env=dict(os.environ, PYTHONPATH=str(project), **{children.FOLDER: str(folder)}),
        preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert children.gather(folder, since=time.time()).why == ""


def test_find_answers_none_without_a_live_worker_and_its_folder_below_one(
    project: Path, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from devpool.select import below

    monkeypatch.setattr(below, "BASE", str(folder.parent / "none"))
    assert below.find() is None  # no base, nothing named: one stat
    monkeypatch.setenv(children.FOLDER, str(folder))
    assert below.find() == str(folder)
    (folder / "started").write_text("1")  # its pid another process's now
    assert below.find() is None


def test_devpool_imports_the_watch_only_below_a_recording_worker(project: Path) -> None:
    """`import devpool` is on every worker's and user's path: children.py (pathlib, ast,
    the watch) is imported exactly where find() names a live worker's folder."""
    code = (
        "import sys, devpool\n"
        "from devpool.select import below\n"
        "print((below.find() is not None) == ('devpool.select.children' in sys.modules))"
    )
    own = {k: v for k, v in os.environ.items() if k != children.FOLDER}
    done = subprocess.run(
        [sys.executable, "-c", code], env=own, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "True", done.stderr
    from devpool.select import below

    assert _imports(below.__file__) == {"__future__", "os", "stat", "devpool.procfs"}
    assert _imports(procfs.__file__) == {"__future__"}


def _imports(source: str | None) -> set[str]:
    """What a module imports: a package's module as package.module, anything else by name."""
    found = set()
    for node in ast.walk(ast.parse(Path(source or "").read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module == "devpool":
            found.update(f"devpool.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.add(node.module or "")
    return found


def test_a_worker_sweeps_the_folders_of_workers_that_are_gone(project: Path, folder: Path) -> None:
    base = folder.parent
    stale = base / "999999999"  # no such pid
    stale.mkdir()
    (stale / "started").write_text("1")
    reused = base / str(os.getppid())  # a live pid, started at another time than its folder
    reused.mkdir()
    (reused / "started").write_text("1")
    making = base / ".999999999"  # one being made by a worker that is gone
    making.mkdir()
    alive = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        theirs = base / str(alive.pid)
        theirs.mkdir()
        (theirs / "started").write_text(str(procfs.started(alive.pid)))
        shutil.rmtree(folder)
        children.make_folder(project)
        assert sorted(os.listdir(base)) == sorted([folder.name, theirs.name])
    finally:
        assert alive.stdin is not None
        alive.stdin.close()
        alive.wait(timeout=30)


def test_a_process_given_its_own_environment_finds_the_worker_among_its_ancestors(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker of its own (this process may be a recording worker, with this pid's folder).
    monkeypatch.delenv(children.FOLDER, raising=False)
    done = subprocess.run(
        [sys.executable, "-c", WORKER, str(project)],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    told = json.loads(done.stdout)
    assert told["why"] == ""
    assert ["mod.py", 3] in told["spots"]


def test_a_folder_left_by_a_process_that_ended_is_not_told(project: Path, folder: Path) -> None:
    """Its pid may be another process's now: a process below that one tells nobody."""
    (folder / "started").write_text("1")  # not this process's start time
    assert start(project, folder, "mod.used()") == 0
    assert sorted(os.listdir(folder)) == ["root", "started"]


def test_a_folder_gone_fails_the_test_closed(folder: Path) -> None:
    import shutil

    shutil.rmtree(folder)
    assert "is gone" in children.gather(folder, since=time.time()).why


def test_a_base_folder_another_user_could_write_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path / "base"
    base.mkdir(mode=0o777)
    base.chmod(0o777)
    monkeypatch.setattr(children, "BASE", base)
    with pytest.raises(OSError, match="not a folder of this user's alone"):
        children.make_folder(tmp_path)


TREE = """
import json, os, signal, subprocess, sys
import devpool, mod


def run(spec):
    getattr(mod, "f%d" % spec["call"])()
    for kid in spec["kids"]:
        if kid["via"] == "exec":
            subprocess.run([sys.executable, __file__, json.dumps(kid)])
        else:
            pid = os.fork()
            if pid == 0:
                run(kid)  # it ends this process, one way or another
            os.waitpid(pid, 0)
    if spec["end"] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if spec["end"] == "_exit":
        os._exit(0)
    sys.exit(0)


run(json.loads(sys.argv[1]))
"""
CALLS = 4  # f0 .. f3 in mod.py, each one line after the other's


def _node(kids: st.SearchStrategy[list[dict[str, Any]]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "call": st.integers(0, CALLS - 1),
            "end": st.sampled_from(["exit", "_exit", "kill"]),
            "via": st.sampled_from(["exec", "fork"]),
            "kids": kids,
        }
    )


TREES = st.recursive(
    _node(st.just([])), lambda inner: _node(st.lists(inner, max_size=2)), max_leaves=4
)


def _walk(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [spec, *(node for kid in spec["kids"] for node in _walk(kid))]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=TREES)
def test_a_tree_of_processes_tells_every_function_it_ran_unless_one_was_killed(
    tree: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Whatever the tree (execs and forks, ended by exit, os._exit or SIGKILL): the test
    fails closed exactly when a process of it was killed, and otherwise depends on each
    function some process of it ran, and on no other."""
    tmp = tmp_path_factory.mktemp("tree")
    root = tmp / "project"
    root.mkdir()
    functions = "".join(f"def f{i}():\n    return {i}\n" for i in range(CALLS))
    (root / "mod.py").write_text(functions)
    (root / "tree.py").write_text(TREE)
    base = tmp / "base"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(children, "BASE", base)
        folder = children.make_folder(root)
    tree = dict(tree, via="exec")
    env = dict(os.environ, PYTHONPATH=str(root), **{children.FOLDER: str(folder)})
    subprocess.run(
        [sys.executable, str(root / "tree.py"), json.dumps(tree)], cwd=root, env=env, timeout=60
    )
    gathered = children.gather(folder, since=time.time())
    nodes = _walk(tree)
    if any(node["end"] == "kill" for node in nodes):
        assert "ended before telling what it ran" in gathered.why
    else:
        assert gathered.why == ""
        ran = {("mod.py", 0)} | {("mod.py", 1 + 2 * node["call"]) for node in nodes}
        assert {spot for spot in gathered.spots if spot[0] == "mod.py"} == ran
    assert sorted(os.listdir(folder)) == ["root", "started"]
