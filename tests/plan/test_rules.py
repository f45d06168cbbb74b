"""plan/rules.py: [tool.devpool.paths] keys and their precedence, and every table mistake as
one sentence naming the key."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devpool.errors import DevpoolError
from devpool.plan.markers import request_for
from devpool.plan.rules import (
    Argument,
    PathRule,
    RuleRequest,
    Rules,
    apply,
    owned_markers,
    parse_rules,
)

PLATFORMS = ("cuda", "sim")


def rules(table: dict[str, Any]) -> Rules:
    return parse_rules(table, "p.toml", PLATFORMS, {"hccl": 2}, owned_markers())


def chosen(keys: dict[str, int], path: str) -> int | None:
    """The device_count the most specific key gives path, None when none covers it."""
    table = {"paths": {key: {"device_count": n} for key, n in keys.items()}}
    rule = rules(table).path_rule("t", tuple(path.split("/")))
    return None if rule is None else rule.request.get("device_count")


def test_a_folder_covers_the_files_below_it_and_not_its_neighbours() -> None:
    keys = {"tests/gpu": 1}
    assert chosen(keys, "tests/gpu/test_a.py") == 1
    assert chosen(keys, "tests/gpu/deep/test_a.py") == 1
    assert chosen(keys, "tests/gpu2/test_a.py") is None
    assert chosen(keys, "tests/test_gpu.py") is None


def test_a_deeper_folder_wins_and_a_file_pattern_beats_its_folder() -> None:
    keys = {"tests": 1, "tests/big": 2, "tests/big/**/test_*_8gpu.py": 8}
    assert chosen(keys, "tests/test_a.py") == 1
    assert chosen(keys, "tests/big/test_a.py") == 2
    assert chosen(keys, "tests/big/test_a_8gpu.py") == 8  # ** matches no folder too
    assert chosen(keys, "tests/big/x/y/test_a_8gpu.py") == 8
    assert chosen(keys, "tests/big/x/test_a_4gpu.py") == 2


def test_a_glob_can_name_folders_and_literal_parts_win_at_one_depth() -> None:
    keys = {"tests/*/gpu": 1, "tests/nn/gpu": 2}
    assert chosen(keys, "tests/ops/gpu/test_a.py") == 1
    assert chosen(keys, "tests/nn/gpu/test_a.py") == 2


def test_two_equally_specific_keys_that_disagree_are_named() -> None:
    table = {"paths": {"tests/*/gpu": {"device_count": 1}, "tests/nn/*": {"device_count": 2}}}
    with pytest.raises(DevpoolError) as error:
        rules(table).path_rule("tests/nn/gpu/test_a.py::t", ("tests", "nn", "gpu", "test_a.py"))
    assert str(error.value) == (
        "tests/nn/gpu/test_a.py::t: [tool.devpool.paths] keys 'tests/*/gpu' and 'tests/nn/*' "
        "both cover it, neither more specific, and ask for different things; add a key for "
        "it, or narrow one"
    )


FOLDERS = st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=4).map("/".join)


@given(st.dictionaries(FOLDERS, st.integers(0, 8), min_size=1, max_size=8), FOLDERS)
def test_the_deepest_folder_key_above_a_file_wins_whatever_the_order(
    keys: dict[str, int], folder: str
) -> None:
    path = folder + "/test_x.py"
    above = [key for key in keys if (path + "/").startswith(key + "/")]
    expected = keys[max(above, key=len)] if above else None
    assert chosen(keys, path) == expected
    assert chosen(dict(reversed(list(keys.items()))), path) == expected
    exact = {**keys, path: 99}  # the file itself is the most specific key of all
    assert chosen(exact, path) == 99


def test_an_alias_reads_a_keyword_a_position_or_a_fixed_value() -> None:
    found = rules(
        {
            "markers": {
                "distributed": {"device_count": "num_gpus"},
                "world_size": {"ranks": "args[0]", "devices_per_rank": 1},
                "gpu": {"device_count": 1, "timeout": 30},
            }
        }
    )
    assert found.aliases["distributed"] == RuleRequest(
        (("device_count", Argument(keyword="num_gpus")),)
    )
    assert found.aliases["world_size"].get("ranks") == Argument(position=0)
    assert found.aliases["gpu"].describe() == "{ device_count = 1, timeout = 30 }"
    assert PathRule("tests/gpu", found.aliases["gpu"]).is_glob is False


@pytest.mark.parametrize(
    ("table", "sentence"),
    [
        (
            {"paths": {"tests/gpu": {"device_cont": 1}}},
            "p.toml: [tool.devpool.paths] 'tests/gpu' has unknown request key 'device_cont'; "
            "did you mean device_count?",
        ),
        (
            {"paths": {"tests/gpu": {"device_count": -1}}},
            "p.toml: [tool.devpool.paths] 'tests/gpu' device_count must be a whole number ≥ 0, "
            "got -1",
        ),
        (
            {"paths": {"tests/gpu": {"device_count": "num_gpus"}}},
            "p.toml: [tool.devpool.paths] 'tests/gpu' device_count must be a whole number ≥ 0, "
            "got 'num_gpus'",
        ),
        (
            {"paths": {"/abs/tests": {"device_count": 1}}},
            "p.toml: [tool.devpool.paths] key '/abs/tests' must be a folder, file or glob "
            "relative to the rootdir (no leading / and no ..)",
        ),
        (
            {"paths": {"tests/gpu": 1}},
            "p.toml: [tool.devpool.paths] 'tests/gpu' must be a table of request keys, e.g. "
            "{ device_count = 1 }, got 1",
        ),
        (
            {"paths": {"tests/gpu": {"platforms": ["tpu"]}}},
            "p.toml: [tool.devpool.paths] 'tests/gpu' platforms names unknown platform 'tpu'; "
            "known: cuda, sim (add others under [tool.devpool.platforms])",
        ),
        (
            {"paths": {"tests/gpu": {"resources": {"nccl": 1}}}},
            "p.toml: [tool.devpool.paths] 'tests/gpu' resources names unknown resource 'nccl'; "
            "declared under [tool.devpool.resources]: hccl",
        ),
        (
            {"paths": {"tests/gpu": {"device_memory": "lots"}}},
            "p.toml: [tool.devpool.paths] 'tests/gpu' device_memory needs a memory size, e.g. "
            "'8GiB', '512MiB' or '1.5GB', got 'lots'",
        ),
        (
            {"markers": {"device_count": {"device_count": 1}}},
            "p.toml: [tool.devpool.markers] 'device_count' is a marker devpool reads itself; "
            "an alias names one of the project's own markers",
        ),
        (
            {"markers": {"world_size": {"ranks": 0}}},
            "p.toml: [tool.devpool.markers] world_size ranks must be a whole number ≥ 1, got 0 "
            '(a string names the argument to read, e.g. "num_gpus" or "args[0]")',
        ),
        (
            {"markers": {"gpu": {"device_count": "num gpus"}}},
            "p.toml: [tool.devpool.markers] gpu device_count = 'num gpus' names no argument: "
            "write a keyword's name (num_gpus) or a position (args[0])",
        ),
        (
            {"markers": []},
            "p.toml: [tool.devpool.markers] must be a table",
        ),
    ],
)
def test_each_table_mistake_is_one_sentence(table: dict[str, Any], sentence: str) -> None:
    with pytest.raises(DevpoolError) as error:
        rules(table)
    assert str(error.value) == sentence


def test_each_part_comes_from_the_nearest_source(pytester: pytest.Pytester) -> None:
    """A test's own device marker keeps its devices, yet a path rule's timeout and an
    alias's ports still apply to it; a test with nothing of its own takes the alias's
    devices over the path rule's."""
    pytester.makeini("[pytest]\nmarkers =\n    distributed(num_gpus)\n")
    items = pytester.getitems(
        """
        import pytest

        @pytest.mark.device_count(3)
        @pytest.mark.distributed(num_gpus=2)
        def test_own():
            pass

        @pytest.mark.distributed(num_gpus=2)
        def test_alias():
            pass
        """
    )
    found = rules(
        {
            "paths": {".": {"device_count": 1, "timeout": 30}},
            "markers": {"distributed": {"device_count": "num_gpus", "ports": 2}},
        }
    )
    sources = apply(items, found, pytester.path)
    own, alias = sorted(items, key=lambda item: item.name, reverse=True)
    assert sources[own.nodeid] == {"devices": "marker", "ports": "alias distributed"} | {
        "timeout": "path ."
    }
    assert sources[alias.nodeid]["devices"] == "alias distributed"
    counts = [request_for(item, PLATFORMS) for item in (own, alias)]
    assert [(r.device_count, r.ports, r.timeout) for r in counts] == [(3, 2, 30.0), (2, 2, 30.0)]
