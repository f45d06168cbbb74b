"""errors.py: the one key check every [tool.devpool…] table goes through, and did-you-mean."""

from __future__ import annotations

import pytest

from devpool.errors import DevpoolError, check_keys, did_you_mean

KNOWN = ("max-parallel", "cpu-slots", "reruns", "reruns-delay")


@pytest.mark.parametrize(
    ("word", "hint"),
    [
        ("max_parallel", "; did you mean max-parallel?"),  # '_' for '-'
        ("max-paralel", "; did you mean max-parallel?"),
        ("MAX-PARALLEL", "; did you mean max-parallel?"),
        ("rerun", "; did you mean reruns?"),
        ("speed", ""),  # nothing close: no guess
    ],
)
def test_a_close_word_is_offered(word: str, hint: str) -> None:
    assert did_you_mean(word, KNOWN) == hint


def test_the_prefix_is_written_before_the_offer() -> None:
    assert did_you_mean("cpu-slot", KNOWN, prefix="--devpool-") == (
        "; did you mean --devpool-cpu-slots?"
    )


def test_an_unknown_key_names_the_file_the_table_and_the_key() -> None:
    with pytest.raises(DevpoolError) as error:
        check_keys({"reruns": 1, "retries": 2}, KNOWN, "tool.devpool.profiles.ci", "/p.toml")
    assert str(error.value) == (
        "/p.toml: [tool.devpool.profiles.ci] has unknown key 'retries'; known keys: "
        "cpu-slots, max-parallel, reruns, reruns-delay"
    )


def test_known_keys_pass() -> None:
    check_keys({"reruns": 1}, KNOWN, "tool.devpool")
