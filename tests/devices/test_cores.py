"""The cores this process may use (devices/cores.py): affinity, capped by a cgroup quota
read from a fake cgroup tree, v2 and v1, along the process's own cgroup path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from devpool.devices.cores import CGROUP_ROOT_ENV, cgroup_quota, usable_cores


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_no_cgroup_files_means_no_quota(tmp_path: Path) -> None:
    assert cgroup_quota(tmp_path, {"": "/"}) is None


def test_v2_quota_along_the_path_the_smallest_counts(tmp_path: Path) -> None:
    write(tmp_path / "cpu.max", "max 100000\n")  # the root: no limit
    write(tmp_path / "ci.slice" / "cpu.max", "800000 100000\n")  # 8 cores
    write(tmp_path / "ci.slice" / "job-7" / "cpu.max", "250000 100000\n")  # 2.5 cores
    assert cgroup_quota(tmp_path, {"": "/ci.slice/job-7"}) == 2.5
    assert cgroup_quota(tmp_path, {"": "/ci.slice"}) == 8.0
    # A path the tree does not have (a container sees its own cgroup as its root).
    assert cgroup_quota(tmp_path, {"": "/elsewhere/deep"}) is None


def test_v1_quota_and_no_limit(tmp_path: Path) -> None:
    cpu = tmp_path / "cpu,cpuacct" / "docker" / "abc"
    write(cpu / "cpu.cfs_quota_us", "300000\n")
    write(cpu / "cpu.cfs_period_us", "100000\n")
    assert cgroup_quota(tmp_path, {"cpu,cpuacct": "/docker/abc"}) == 3.0
    write(cpu / "cpu.cfs_quota_us", "-1\n")
    assert cgroup_quota(tmp_path, {"cpu,cpuacct": "/docker/abc"}) is None


def test_garbage_files_are_no_quota(tmp_path: Path) -> None:
    write(tmp_path / "cpu.max", "lots 0\n")
    write(tmp_path / "cpu" / "cpu.cfs_quota_us", "x\n")
    assert cgroup_quota(tmp_path, {"": "/", "cpu": "/"}) is None


def test_usable_cores_is_affinity_capped_by_the_quota(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    affinity = len(os.sched_getaffinity(0))
    monkeypatch.setenv(CGROUP_ROOT_ENV, str(tmp_path))
    assert usable_cores().count == affinity and usable_cores().quota is None
    write(tmp_path / "cpu.max", "50000 100000\n")  # half a core: still one
    cores = usable_cores()
    assert (cores.count, cores.quota, cores.affinity) == (1, 0.5, affinity)
    if affinity > 1:
        assert cores.describe() == f"1 core (cgroup quota 0.5 of {affinity} by affinity)"
    write(tmp_path / "cpu.max", f"{(affinity + 4) * 100000} 100000\n")  # above the mask
    assert usable_cores().count == affinity
