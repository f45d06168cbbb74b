"""End to end: a suite with no devpool marker runs under devpool from [tool.devpool.paths]
and [tool.devpool.markers] alone, and `devpool adopt` shows what each test gets (issue 38).

Every target test asserts the number of devices it was given, so the session passes only
if each got what its rule says.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sessions import FAST, text

DEVPOOL = (sys.executable, "-m", "devpool.cli")
COUNT = """
import os


def given():
    return len([d for d in os.environ.get("DEVPOOL_DEVICES", "").split(",") if d])
"""

PYPROJECT = """
[tool.pytest.ini_options]
markers = ["distributed(num_gpus)", "world_size(n)"]
testpaths = ["tests"]

[tool.devpool.paths]
"tests/gpu" = { device_count = 1 }
"tests/big/**/test_*_4gpu.py" = { device_count = 4 }
"tests/distributed" = { ranks = 2 }

[tool.devpool.markers]
distributed = { device_count = "num_gpus" }
world_size = { device_count = "args[0]" }
"""

FILES = {
    "tests/gpu/test_gpu.py": """
        import pytest
        from count import given

        def test_path_rule():
            assert given() == 1

        @pytest.mark.distributed(num_gpus=2)
        def test_alias_over_path_rule():
            assert given() == 2

        @pytest.mark.device_count(3)
        @pytest.mark.distributed(num_gpus=2)
        def test_marker_over_alias():
            assert given() == 3
    """,
    "tests/big/sub/test_all_4gpu.py": """
        from count import given

        def test_glob():
            assert given() == 4

        def test_on_the_device():
            x = "cuda"
    """,
    "tests/unit/test_world.py": """
        import pytest
        from count import given

        @pytest.mark.world_size(2)
        def test_positional_alias():
            assert given() == 2

        def test_cpu():
            assert given() == 0

        def test_sneaky(device):
            t = make().to(device)
    """,
    "tests/distributed/test_ranks.py": """
        def test_ranks_rule():
            pass
    """,
}


def project(root: Path, pyproject: str = PYPROJECT, files: dict[str, str] | None = None) -> None:
    (root / "pyproject.toml").write_text(textwrap.dedent(pyproject))
    (root / "count.py").write_text(COUNT)
    for name, body in (FILES if files is None else files).items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(body))


def devpool(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "DEVPOOL_"))}
    environ["PYTHONPATH"] = str(cwd)
    return subprocess.run(
        [*DEVPOOL, *args], cwd=cwd, env=environ, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def here(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PYTHONPATH", str(pytester.path))  # count.py, in every worker
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # FAST names devpool's plugin
    return pytester.path


def session(pytester: pytest.Pytester, lock: Path, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(*FAST, f"--devpool-lock-dir={lock}", *args, timeout=120)


def test_every_test_gets_the_devices_its_rule_says(
    pytester: pytest.Pytester, here: Path, lock: Path
) -> None:
    files = {k: v for k, v in FILES.items() if "distributed" not in k and "unit" not in k}
    files["tests/unit/test_world.py"] = FILES["tests/unit/test_world.py"].split("def test_sneaky")[
        0
    ]
    project(here, files=files)
    (here / "pyproject.toml").write_text(
        textwrap.dedent(PYPROJECT).replace('"tests/distributed" = { ranks = 2 }\n', "")
    )
    result = session(pytester, lock, "--devices", "sim:0-3")
    assert result.ret == 0, text(result)
    result.assert_outcomes(passed=7)
    assert "matches no collected test" not in text(result)


def test_adopt_names_each_rule_and_the_undeclared_device_tests(here: Path) -> None:
    project(here)
    done = devpool(here, "adopt", "--format", "json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["schema"] == "devpool-adopt/1"
    rule = {t["nodeid"].split("::")[1]: (t["device_count"], t["rule"]) for t in data["tests"]}
    assert rule == {
        "test_path_rule": (1, "path tests/gpu"),
        "test_alias_over_path_rule": (2, "alias distributed"),
        "test_marker_over_alias": (3, "marker"),
        "test_glob": (4, "path tests/big/**/test_*_4gpu.py"),
        "test_on_the_device": (4, "path tests/big/**/test_*_4gpu.py"),
        "test_positional_alias": (2, "alias world_size"),
        "test_cpu": (0, "none"),
        "test_sneaky": (0, "none"),
        "test_ranks_rule": (2, "path tests/distributed"),
    }
    (undeclared,) = data["undeclared"]
    assert undeclared["nodeid"] == "tests/unit/test_world.py::test_sneaky"
    assert (undeclared["where"], undeclared["text"]) == (
        "tests/unit/test_world.py:13",
        "t = make().to(device)",
    )
    assert data["suggested_paths"] == {"tests/unit/test_world.py": {"device_count": 1}}
    assert data["unmatched_paths"] == []

    shown = devpool(here, "adopt")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == "9 tests by devices: cpu: 2, 1: 1, 2: 3, 3: 1, 4: 2"
    assert any(
        line.split()
        == ["tests/gpu/test_gpu.py::test_alias_over_path_rule", "2", "devices"]
        + ["alias", "distributed"]
        for line in lines
    )
    assert (
        "  tests/unit/test_world.py::test_sneaky  tests/unit/test_world.py:13: "
        "t = make().to(device)" in lines
    )
    assert (
        lines[-1] == '"tests/unit/test_world.py" = { device_count = 1 }  # 1 seen to use a device'
    )

    markdown = devpool(here, "adopt", "--format", "markdown")
    assert "| `tests/gpu/test_gpu.py::test_path_rule` | 1 device | path tests/gpu |" in (
        markdown.stdout
    )

    capacity = devpool(here, "capacity", "--platform", "sim", "--format", "json")
    assert capacity.returncode == 0, capacity.stderr
    rows = {row["label"]: row["tests"] for row in json.loads(capacity.stdout)["rows"]}
    assert rows == data["by_devices"]


def test_a_path_key_that_covers_no_test_is_a_warning_line(
    pytester: pytest.Pytester, here: Path, lock: Path
) -> None:
    pyproject = '[tool.devpool.paths]\n"tests/gone/**" = { device_count = 1 }\n'
    project(here, pyproject, {"tests/test_a.py": "def test_a():\n    pass\n"})
    result = session(pytester, lock, "--devices", "sim:0-1")
    assert result.ret == 0, text(result)
    assert "devpool: [tool.devpool.paths] 'tests/gone/**' matches no collected test" in (
        result.outlines
    )
    done = devpool(here, "adopt")
    assert done.returncode == 0
    assert done.stderr.splitlines() == [
        "devpool: warning: [tool.devpool.paths] 'tests/gone/**' matches no collected test"
    ]


@pytest.mark.parametrize(
    ("pyproject", "body", "sentence"),
    [
        (
            '[tool.devpool.paths]\n"tests" = { devices = 1 }\n',
            "def test_a():\n    pass\n",
            "[tool.devpool.paths] 'tests' has unknown request key 'devices'",
        ),
        (
            '[tool.devpool.paths]\n"tests" = { device_count = -2 }\n',
            "def test_a():\n    pass\n",
            "[tool.devpool.paths] 'tests' device_count must be a whole number ≥ 0, got -2",
        ),
        (
            "[tool.devpool.markers]\nports = { device_count = 1 }\n",
            "def test_a():\n    pass\n",
            "[tool.devpool.markers] 'ports' is a marker devpool reads itself",
        ),
        (
            '[tool.devpool.markers]\ndistributed = { device_count = "num_gpus" }\n',
            "import pytest\n\n@pytest.mark.distributed(gpus=2)\ndef test_a():\n    pass\n",
            "tests/test_a.py::test_a: @pytest.mark.distributed has no num_gpus= argument, "
            "which [tool.devpool.markers] distributed reads as device_count",
        ),
        (
            '[tool.devpool.markers]\ndistributed = { device_count = "num_gpus" }\n',
            "import pytest\n\n@pytest.mark.distributed(num_gpus='2')\ndef test_a():\n    pass\n",
            "tests/test_a.py::test_a: @pytest.mark.distributed gives num_gpus= '2', which "
            "[tool.devpool.markers] distributed reads as device_count: it must be a whole "
            "number ≥ 0",
        ),
    ],
)
def test_each_config_mistake_is_one_sentence_and_exit_4(
    pytester: pytest.Pytester, here: Path, lock: Path, pyproject: str, body: str, sentence: str
) -> None:
    project(here, pyproject, {"tests/test_a.py": body})
    result = session(pytester, lock, "--devices", "sim:0-1")
    assert result.ret == 4, text(result)
    assert sentence in result.stderr.str()
    assert "Traceback" not in text(result)
    done = devpool(here, "adopt")
    assert done.returncode == 4, done.stdout
    (line,) = done.stderr.splitlines()
    assert line.startswith("devpool: error: ") and sentence in line


PLUGIN = """
import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "world_size(n): the plugin's own marker")


@pytest.fixture
def world_size(request):
    return request.node.get_closest_marker("world_size").args[0]
"""


def test_an_alias_of_a_plugins_marker_leaves_the_plugin_its_meaning(
    pytester: pytest.Pytester, here: Path, lock: Path
) -> None:
    """The plugin reads its marker as without devpool (plain pytest, the same suite); the
    alias reads it too, for the devices."""
    body = """
        import pytest
        from count import given

        @pytest.mark.world_size(2)
        def test_a(world_size):
            assert world_size == 2
            assert given() == {devices}
    """
    pyproject = '[tool.devpool.markers]\nworld_size = { device_count = "args[0]" }\n'
    project(here, pyproject, {"tests/test_a.py": body.format(devices=0)})
    (here / "ws_plugin.py").write_text(PLUGIN)
    plain = pytester.runpytest_subprocess("-p", "ws_plugin")
    assert plain.ret == 0, text(plain)
    plain.assert_outcomes(passed=1)
    project(here, pyproject, {"tests/test_a.py": body.format(devices=2)})
    result = session(pytester, lock, "-p", "ws_plugin", "--devices", "sim:0-3")
    assert result.ret == 0, text(result)
    result.assert_outcomes(passed=1)


SKIPS = """
import unittest

import pytest
from count import visible


@pytest.mark.world_size(8)
@pytest.mark.skipif(visible() < 8, reason="needs 8 devices")
def test_bool_condition():
    pass


@pytest.mark.world_size(8)
@pytest.mark.skipif("visible() < 8", reason="needs 8 devices, said in a string")
def test_string_condition():
    pass


@pytest.mark.world_size(8)
@unittest.skipUnless(visible() >= 8, "needs 8 devices, said to unittest")
def test_unittest_decorator():
    pass


@pytest.mark.world_size(2)
@pytest.mark.skipif(visible() < 2, reason="needs 2 devices")
def test_fits():
    pass
"""


def test_a_skip_that_counts_devices_is_plain_pytests_skip(
    pytester: pytest.Pytester, here: Path, lock: Path
) -> None:
    """The controller sees the host's 4 devices, as plain pytest does: tests whose skip
    condition wants 8 are skipped with pytest's own reason and place, not failed as
    unsatisfiable; the one that fits runs on its 2 devices."""
    pyproject = '[tool.devpool.markers]\nworld_size = { device_count = "args[0]" }\n'
    project(here, pyproject, {"tests/test_skips.py": SKIPS})
    (here / "count.py").write_text(
        COUNT
        + "\n\ndef visible():\n"
        + "    ids = os.environ.get('DEVPOOL_SIM_VISIBLE_DEVICES')\n"
        + "    return 4 if ids is None else len([d for d in ids.split(',') if d])\n"
    )
    plain = pytester.runpytest_subprocess("-p", "no:devpool", "-rs")
    result = session(pytester, lock, "--devices", "sim:0-3", "-rs")
    assert result.ret == plain.ret == 0, text(result)

    def skips(run: pytest.RunResult) -> list[str]:
        return sorted(line for line in run.outlines if line.startswith("SKIPPED"))

    assert len(skips(plain)) == 3
    assert skips(result) == skips(plain)
    result.assert_outcomes(passed=1, skipped=3)


def test_adopt_shows_a_ranks_request_as_the_plan_does(
    pytester: pytest.Pytester, here: Path, lock: Path
) -> None:
    """A ranks request (a path rule's `ranks = 2`, an alias to ranks) reads in `devpool
    adopt` as in --devpool-plan ("2 ranks × 1 device"), and its JSON names the ranks."""
    pyproject = PYPROJECT.replace(
        "[tool.devpool.markers]\n", '[tool.devpool.markers]\nworld = { ranks = "args[0]" }\n'
    ).replace('markers = ["distributed', 'markers = ["world(n)", "distributed')
    files = dict(FILES)
    files["tests/unit/test_alias.py"] = (
        "import pytest\n\n@pytest.mark.world(2)\ndef test_rank_alias():\n    pass\n"
    )
    project(here, pyproject, files)

    plan = session(pytester, lock, "--devices", "sim:0-3", "--devpool-plan")
    assert plan.ret == 0, text(plan)
    planned = {line.split()[-1]: line for line in plan.outlines if "::test_" in line}
    shown = devpool(here, "adopt")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(devpool(here, "adopt", "--format", "json").stdout)
    ranks = {t["nodeid"]: t["ranks"] for t in data["tests"]}
    for nodeid in (
        "tests/distributed/test_ranks.py::test_ranks_rule",
        "tests/unit/test_alias.py::test_rank_alias",
    ):
        assert "2 ranks × 1 device" in planned[nodeid], planned[nodeid]
        line = next(line for line in shown.stdout.splitlines() if nodeid in line)
        assert "2 ranks × 1 device" in line, line
        assert ranks[nodeid] == 2
    assert ranks["tests/gpu/test_gpu.py::test_path_rule"] == 0
