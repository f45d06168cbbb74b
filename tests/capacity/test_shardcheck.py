"""Unit tests of `devpool shard verify` (shardcheck.py) on records written by RecordWriter."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest

from devpool.capacity.shardcheck import read_shard_runs, verify
from devpool.capacity.shards import Split, shard_item, split_suite
from devpool.errors import DevpoolError
from devpool.plan.markers import Request
from devpool.report.record import RecordWriter

TESTS = [f"t.py::test_{i}" for i in range(9)]


def split_of(estimates: dict[str, float] | None = None) -> Split:
    items = [shard_item(n, Request(1), (estimates or {}).get(n, 1.0)) for n in TESTS]
    return split_suite(TESTS, items, 3)


def write(
    path: Path,
    split: Split,
    k: int,
    ran: Iterable[str] | None = None,
    finished: bool = True,
    deselected: Iterable[str] = (),
) -> Path:
    record = RecordWriter(path)
    record.write("session_start", run_id="r", platform="sim", devices=[0], tests=3)
    record.write(
        "shard",
        shard=f"{k}/3",
        k=k,
        n=3,
        fingerprint=split.fingerprint,
        costs=split.costs,
        split=[list(s) for s in split.shards],
        deselected=sorted(deselected),
    )
    for job, nodeid in enumerate(split.shards[k - 1] if ran is None else ran):
        record.write("job_end", job=job, nodeid=nodeid, test=nodeid, outcome="passed")
    if finished:
        record.write("session_end", exitstatus=0)
    record.close()
    return path


def records(tmp_path: Path, split: Split) -> list[Path]:
    return [write(tmp_path / f"shard{k}.jsonl", split, k) for k in (1, 2, 3)]


def test_three_shards_of_one_split_pass(tmp_path: Path) -> None:
    verdict = verify(read_shard_runs(records(tmp_path, split_of())))
    assert verdict.ok
    assert verdict.render() == (
        f"devpool shard verify: OK: 3 shards, 9 tests, each ran exactly once "
        f"(split {split_of().fingerprint})\n"
    )


def test_shards_of_different_histories_fail_naming_the_tests(tmp_path: Path) -> None:
    before = split_of()
    after = split_of({TESTS[0]: 50.0, TESTS[1]: 40.0})  # a history merged between shards
    assert before.shards != after.shards
    paths = [
        write(tmp_path / "1.jsonl", before, 1),
        write(tmp_path / "2.jsonl", after, 2),
        write(tmp_path / "3.jsonl", after, 3),
    ]
    verdict = verify(read_shard_runs(paths))
    text = verdict.render()
    assert not verdict.ok
    assert "the shards were split differently (2 fingerprints" in text
    ran = [set(before.shards[0]), set(after.shards[1]), set(after.shards[2])]
    never = sorted(set(TESTS) - set().union(*ran))
    twice = sorted(t for t in TESTS if sum(t in r for r in ran) > 1)
    assert never or twice
    for test in never + twice:
        assert f"    {test}" in text


def test_a_missing_shard_names_its_tests(tmp_path: Path) -> None:
    split = split_of()
    one, _two, three = records(tmp_path, split)
    text = verify(read_shard_runs([one, three])).render()
    assert "shard 2/3 has no record; the split gives it 3 tests" in text
    assert "3 tests ran in no shard:\n" in text
    for test in split.shards[1]:
        assert f"    {test}\n" in text


def test_a_shard_given_twice_names_the_tests_run_twice(tmp_path: Path) -> None:
    split = split_of()
    one, two, three = records(tmp_path, split)
    copy = tmp_path / "again.jsonl"
    copy.write_bytes(one.read_bytes())
    text = verify(read_shard_runs([one, two, three, copy])).render()
    assert f"shard 1/3 is given 2 times: {one}, {copy}" in text
    for test in split.shards[0]:
        assert f"    {test}  (shards 1/3, 1/3)\n" in text


def test_a_cut_shard_and_its_unrun_tests_are_named(tmp_path: Path) -> None:
    split = split_of()
    one, two, _ = records(tmp_path, split)
    cut = write(tmp_path / "cut.jsonl", split, 3, ran=split.shards[2][:1], finished=False)
    text = verify(read_shard_runs([one, two, cut])).render()
    assert f"{cut} (shard 3/3) is the record of a run that was cut" in text
    for test in split.shards[2][1:]:
        assert f"    {test}\n" in text


def test_tests_deselected_after_the_split_are_not_missing(tmp_path: Path) -> None:
    split = split_of()
    one, two, _ = records(tmp_path, split)
    dropped = split.shards[2][0]
    three = write(tmp_path / "3.jsonl", split, 3, ran=split.shards[2][1:], deselected=[dropped])
    verdict = verify(read_shard_runs([one, two, three]))
    assert verdict.ok, verdict.render()
    assert "8 tests, each ran exactly once, 1 deselected" in verdict.render()


def test_a_record_without_a_shard_event_is_one_sentence(tmp_path: Path) -> None:
    record = RecordWriter(tmp_path / "plain.jsonl")
    record.write("session_start", run_id="r")
    record.close()
    with pytest.raises(DevpoolError, match="has no shard event: it was not a --devpool-shard run"):
        read_shard_runs([tmp_path / "plain.jsonl"])
    with pytest.raises(DevpoolError, match="give the run records of every shard"):
        read_shard_runs([])


def test_a_damaged_shard_event_is_one_sentence(tmp_path: Path) -> None:
    record = RecordWriter(tmp_path / "bad.jsonl")
    record.write("session_start", run_id="r")
    record.write("shard", k=2, n=3, fingerprint="x", costs="y", split=[["a"]])
    record.close()
    with pytest.raises(DevpoolError, match=r"its shard event is damaged \(its split does not hold"):
        read_shard_runs([tmp_path / "bad.jsonl"])
