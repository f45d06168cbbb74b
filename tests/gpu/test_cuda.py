"""devpool on a real CUDA host: each case runs a real devpool session with `--devices auto`.

Skipped where torch or a CUDA device is missing (as on CI). `bash tests/gpu/run.sh` runs
them all in under 5 minutes; tests/gpu/README.md holds the results of the last GPU host.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


def _why_not() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device"
    return None


WHY_NOT = _why_not()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"GPU check: {WHY_NOT}")

RUN_BOUND = 240


def _session(
    folder: Path, body: str, *args: str, name: str = "test_gpu.py"
) -> tuple[int, str, list[dict[str, object]]]:
    """Run devpool on a one-file suite; (exit code, output, record events)."""
    (folder / name).write_text(textwrap.dedent(body))
    record = folder / f"record-{name}.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    argv = [
        sys.executable,
        "-m",
        "pytest",
        str(folder / name),
        "--devices",
        "auto",
        f"--devpool-lock-dir={folder / 'locks'}",
        f"--devpool-run-record={record}",
        "-p",
        "no:cacheprovider",
        "-rA",
        *args,
    ]
    done = subprocess.run(
        argv, cwd=folder, env=env, capture_output=True, text=True, timeout=RUN_BOUND
    )
    events = (
        [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    )
    return done.returncode, done.stdout + done.stderr, events


def _finals(events: list[dict[str, object]]) -> dict[str, str]:
    return {
        str(e["nodeid"]).split("::")[-1]: str(e["outcome"])
        for e in events
        if e["type"] == "job_end" and not e["retried"]
    }


def test_each_test_sees_exactly_its_gpu_and_cpu_tests_see_none(tmp_path: Path) -> None:
    code, output, events = _session(
        tmp_path,
        """
        import os
        import pytest
        import torch

        @pytest.mark.device_count(1)
        def test_one_gpu():
            assert torch.cuda.device_count() == 1
            assert os.environ["CUDA_VISIBLE_DEVICES"] == os.environ["DEVPOOL_DEVICES"]
            assert torch.ones(4, device="cuda").sum().item() == 4

        def test_cpu_sees_no_gpu():
            assert torch.cuda.device_count() == 0
        """,
    )
    assert code == 0, output
    assert _finals(events) == {"test_one_gpu": "passed", "test_cpu_sees_no_gpu": "passed"}


def test_a_timeout_in_a_cuda_loop_is_a_timeout_and_only_that_test(tmp_path: Path) -> None:
    code, output, events = _session(
        tmp_path,
        """
        import pytest
        import torch

        @pytest.mark.timeout(8)
        @pytest.mark.device_count(1)
        def test_a_spins():
            x = torch.ones(1024, device="cuda")
            while True:
                x = x * 1.0000001
                torch.cuda.synchronize()

        @pytest.mark.device_count(1)
        def test_b_after():
            assert torch.ones(2, device="cuda").sum().item() == 2
        """,
    )
    assert code == 1, output
    assert _finals(events) == {"test_a_spins": "timeout", "test_b_after": "passed"}, output


def test_sigkill_holding_gpu_memory_frees_it(tmp_path: Path) -> None:
    code, output, events = _session(
        tmp_path,
        """
        import os, signal
        import pytest
        import torch

        @pytest.mark.device_count(1)
        def test_a_dies_holding_16gib():
            x = torch.empty(16 * 2**30, dtype=torch.uint8, device="cuda")
            torch.cuda.synchronize()
            os.kill(os.getpid(), signal.SIGKILL)

        @pytest.mark.device_count(1)
        def test_b_memory_came_back():
            free, total = torch.cuda.mem_get_info()
            assert total - free < 8 * 2**30, (free, total)
        """,
        "--devpool-reruns-infra=0",
    )
    assert code == 1, output
    finals = _finals(events)
    assert finals == {"test_a_dies_holding_16gib": "crashed", "test_b_memory_came_back": "passed"}


def test_a_device_side_assert_fails_only_its_test_and_keeps_the_gpu(tmp_path: Path) -> None:
    code, output, events = _session(
        tmp_path,
        """
        import pytest
        import torch

        @pytest.mark.device_count(1)
        def test_a_indexing_bug():
            x = torch.zeros(10, device="cuda")
            x[torch.tensor([1000], device="cuda")] = 1.0
            torch.cuda.synchronize()

        @pytest.mark.device_count(1)
        @pytest.mark.parametrize("n", range(3))
        def test_b_healthy(n):
            assert torch.ones(3, device="cuda").sum().item() == 3
        """,
    )
    assert code == 1, output
    finals = _finals(events)
    assert finals.pop("test_a_indexing_bug") == "failed", output
    assert set(finals.values()) == {"passed"} and len(finals) == 3, output
    assert not [e for e in events if e["type"] == "device_bad"], output
    assert [e for e in events if e["type"] == "device_ok"], output


def test_a_foreign_process_on_the_gpu_is_refused(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import torch, time; x = torch.ones(1, device='cuda'); print('ready', flush=True); "
            "time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        code, output, events = _session(
            tmp_path,
            """
            import pytest

            @pytest.mark.device_count(1)
            def test_wants_the_gpu():
                pass
            """,
            "--devpool-lease-timeout=5",
        )
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    assert code == 1, output
    (end,) = [e for e in events if e["type"] == "job_end"]
    assert end["outcome"] == "infra" and str(holder.pid) in str(end["detail"]), end


def test_two_concurrent_sessions_never_share_the_gpu(tmp_path: Path) -> None:
    body = """
    import os, time
    from pathlib import Path
    import pytest
    import torch

    @pytest.mark.device_count(1)
    @pytest.mark.parametrize("n", range(3))
    def test_hold(n):
        began = time.time()
        torch.ones(1, device="cuda")
        time.sleep(0.5)
        Path(os.environ["SPANS"], f"{os.getpid()}-{n}-{began}").write_text(str(time.time()))
    """
    spans = tmp_path / "spans"
    spans.mkdir()
    os.environ["SPANS"] = str(spans)
    try:
        runs = []
        for name in ("test_first.py", "test_second.py"):
            (tmp_path / name).write_text(textwrap.dedent(body))
            argv = [
                sys.executable,
                "-m",
                "pytest",
                str(tmp_path / name),
                "--devices",
                "auto",
                f"--devpool-lock-dir={tmp_path / 'locks'}",
                "-p",
                "no:cacheprovider",
            ]
            runs.append(subprocess.Popen(argv, cwd=tmp_path))
        assert [run.wait(timeout=RUN_BOUND) for run in runs] == [0, 0]
    finally:
        del os.environ["SPANS"]
    intervals = sorted(
        (float(p.name.rsplit("-", 1)[1]), float(p.read_text())) for p in spans.iterdir()
    )
    assert len(intervals) == 6
    for (_, end), (start, _) in zip(intervals, intervals[1:], strict=False):
        assert start >= end, intervals


FORKED = """
import os
import pytest
import torch  # imported by the template; CUDA is initialised in each forked test only

# Evaluated at import, in the template: asks NVML there (no cuInit), so forks stay safe.
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")


def _parent():
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as cmdline:
        return cmdline.read().replace(b"\\0", b" ").decode()


@pytest.mark.device_count(1)
@pytest.mark.parametrize("n", range(8))
def test_cuda_in_a_fork(n):
    assert "--devpool-worker template," in _parent()
    assert not torch.cuda.is_initialized()  # nothing inherited from the template
    assert torch.ones(4, device="cuda").sum().item() == 4
"""


def test_isolated_cuda_tests_fork_from_a_template_and_initialise_cuda_themselves(
    tmp_path: Path,
) -> None:
    code, output, events = _session(tmp_path, FORKED, "--devpool-isolation", "job")
    assert code == 0, output
    assert "fork server" not in output, output  # torch imported, no context: safe to fork
    assert sorted(_finals(events).values()) == ["passed"] * 8, output


def test_a_module_that_initialises_cuda_at_import_is_named_and_runs_fresh(
    tmp_path: Path,
) -> None:
    body = """
    import pytest
    import torch

    WARM = torch.zeros(1, device="cuda")  # a CUDA context at import: no fork is safe

    @pytest.mark.device_count(1)
    def test_eager():
        assert WARM.device.type == "cuda"
    """
    code, output, events = _session(
        tmp_path, body, "--devpool-isolation", "job", name="test_eager.py"
    )
    assert code == 0, output
    assert "importing test_eager.py initialised torch.cuda" in output, output
    assert _finals(events) == {"test_eager": "passed"}, output


def test_warm_device_workers_are_forks_with_one_cuda_context_each_by_default(
    tmp_path: Path,
) -> None:
    """The default mode (warm workers, no isolation): every GPU worker is a fork of the
    1-device template, creates its own CUDA context, and its lease reached its first test
    at fork cost (lease_to_start in the record)."""
    code, output, events = _session(tmp_path, FORKED)
    assert code == 0, output
    assert "fork server" not in output, output
    assert sorted(_finals(events).values()) == ["passed"] * 8, output
    waits = [float(str(e["lease_to_start"])) for e in events if "lease_to_start" in e]
    assert waits and max(waits) < 1.0, waits


GLOO_AFTER_FORK = """
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    value = torch.ones(1) * (rank + 1)
    dist.all_reduce(value)
    assert value.item() == 3
    if torch.cuda.is_available():
        assert torch.ones(1, device="cuda").item() == 1  # a context in each rank
    dist.destroy_process_group()


@pytest.mark.device_count(1)
@pytest.mark.ports(1)
@pytest.mark.parametrize("n", range(2))
def test_two_ranks_after_a_fork(n):
    port = int(os.environ["DEVPOOL_PORTS"].split(",")[0])
    mp.spawn(_rank, args=(port,), nprocs=2, join=True)
"""


def test_two_rank_gloo_tests_spawned_from_a_forked_worker(tmp_path: Path) -> None:
    """mp.spawn from a worker that is itself a fork of a template that imported torch."""
    code, output, events = _session(tmp_path, GLOO_AFTER_FORK, name="test_gloo.py")
    assert code == 0, output
    assert sorted(_finals(events).values()) == ["passed"] * 2, output


NCCL_RANKS = """
import os

import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.ranks(2)  # one GPU per rank


def group():
    if not dist.is_initialized():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")


@pytest.mark.parametrize("n", range(3))
def test_all_reduce_on_the_ranks_own_gpu(n, devpool_rank):
    group()
    assert torch.cuda.device_count() == 2  # every rank sees the test's two GPUs
    tensor = torch.ones(1 << 20, device=f"cuda:{devpool_rank.local_rank}")
    dist.all_reduce(tensor)
    assert tensor[0].item() == 2.0
    with open(f"pids-{n}-{devpool_rank.rank}.txt", "w") as out:
        out.write(str(os.getpid()))
"""


@pytest.mark.skipif(
    WHY_NOT is None and __import__("torch").cuda.device_count() < 2,
    reason="GPU check: a two-rank NCCL test needs two GPUs",
)
def test_two_rank_nccl_tests_reuse_one_group(tmp_path: Path) -> None:
    code, output, events = _session(tmp_path, NCCL_RANKS)
    assert code == 0, output
    assert set(_finals(events).values()) == {"passed"}, output
    # The group one test made served the next: the same two processes ran all three.
    pids = {n: {(tmp_path / f"pids-{n}-{r}.txt").read_text() for r in (0, 1)} for n in range(3)}
    assert pids[0] == pids[1] == pids[2], pids


# ---- issue 52: every device handed over clean ----------------------------------------------


def _nvml_used_by(pid: int) -> int:
    """Bytes NVML says pid holds on any device, 0 when NVML is missing."""
    try:
        import pynvml
    except ImportError:
        return 0
    pynvml.nvmlInit()
    try:
        used = 0
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == pid:
                    used += int(proc.usedGpuMemory or 0)
        return used
    finally:
        pynvml.nvmlShutdown()


def test_a_leaked_server_holding_gpu_memory_is_ended_before_the_next_test(
    tmp_path: Path,
) -> None:
    """A server started in its own session allocates 4 GiB and is never stopped: named LEAK,
    ended, and the next test on the GPU sees neither it nor its memory (NVML, from inside)."""
    code, output, events = _session(
        tmp_path,
        f"""
        import os, subprocess, sys
        import pytest
        import torch

        SERVER = (
            "import torch, time; x = torch.empty(4 * 2**30, dtype=torch.uint8, device='cuda'); "
            "torch.cuda.synchronize(); print('up', flush=True); time.sleep(600)"
        )

        @pytest.mark.device_count(1)
        def test_a_leaves_a_server():
            proc = subprocess.Popen(
                [sys.executable, "-c", SERVER], start_new_session=True, stdout=subprocess.PIPE
            )
            assert proc.stdout.readline() == b"up\\n"
            open({str(tmp_path / "server.pid")!r}, "w").write(str(proc.pid))

        @pytest.mark.device_count(1)
        def test_b_sees_nothing_of_it():
            import pynvml
            pid = int(open({str(tmp_path / "server.pid")!r}).read())
            assert not os.path.exists(f"/proc/{{pid}}")
            pynvml.nvmlInit()
            index = int(os.environ["DEVPOOL_DEVICES"])
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            others = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
            assert pid not in others, others
        """,
        "--devpool-max-parallel=1",
    )
    assert code == 0, output
    leaks = [e for e in events if e["type"] == "leak"]
    assert [str(e["nodeid"]).split("::")[-1] for e in leaks] == ["test_a_leaves_a_server"]
    assert leaks[0]["ended"] in ("terminated", "killed"), leaks
    assert "LEAK" in output
    pid = int((tmp_path / "server.pid").read_text())
    assert _nvml_used_by(pid) == 0


def test_a_tensor_kept_in_a_warm_worker_retires_it(tmp_path: Path) -> None:
    """A test keeps 2 GiB in a global (torch's caching allocator): the memory is named, the
    worker retired, and the next test runs in a fresh process that holds nothing."""
    code, output, events = _session(
        tmp_path,
        """
        import os
        import pytest
        import torch

        KEPT = []

        @pytest.mark.device_count(1)
        def test_a_keeps_a_tensor():
            KEPT.append(torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda"))
            open("first.pid", "w").write(str(os.getpid()))

        @pytest.mark.device_count(1)
        def test_b_fresh():
            assert str(os.getpid()) != open("first.pid").read()
            assert torch.cuda.memory_allocated() == 0
        """,
        "--devpool-max-parallel=1",
        "--devpool-leak-memory-share=0",
    )
    assert code == 0, output
    [leak] = [e for e in events if e["type"] == "leak"]
    assert leak["kind"] == "memory" and leak["ended"] == "retired", leak
