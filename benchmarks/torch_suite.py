"""A real torch suite (issue 28): devpool's default mode and job isolation against plain pytest.

torch from the package index, on the CPU. The conftest imports torch (as a torch project's
does); 60 CPU tests of tensor maths; 32 one-device model tests (a small MLP trained a few
steps); 8 two-rank gloo all-reduce tests through torch.multiprocessing.spawn, on
MASTER_PORT (devpool leases one per test); and a module that runs a parallel op at import
(`torch.softmax` over a 1024 x 1024 tensor starts OpenMP's threads in whoever imports it:
its template must not fork, and no test may hang). Variants alternate:

- plain pytest, serial (devpool installed, not on);
- devpool --devices sim:0-3, the default mode (warm forked workers): target ≤ 1.2x plain;
- devpool --devices sim:0-3 --devpool-isolation job (a process per test): target ≤ 1.5x
  the default mode.

On a host with fewer cores than sim devices, one-device model tests side by side each
start an OpenMP pool as wide as the host, and the pools spin against each other; plain
pytest runs them one at a time. --omp-threads N sets OMP_NUM_THREADS for every variant.

Needs torch in the running interpreter (`pip install torch`); exits 0 with a line saying
so when it is missing.

    python benchmarks/torch_suite.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
from pathlib import Path

from common import PYTEST, Variant, alternate, devpool_options, show_ratio, suite_root, timed

CONFTEST = "import torch  # noqa: F401\n"

CPU_MODULE = """
import pytest
import torch


@pytest.mark.parametrize("n", range(60))
def test_maths(n):
    a = torch.arange(n + 4, dtype=torch.float32)
    assert torch.allclose((a * 2).sum(), a.sum() * 2)
"""

MODEL_MODULE = """
import pytest
import torch


@pytest.mark.device_count(1)
@pytest.mark.parametrize("seed", range(32))
def test_model_learns(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(256, 64), torch.randn(256, 1)
    first = None
    for _ in range(60):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        first = first if first is not None else loss.item()
    assert loss.item() < first
"""

DIST_MODULE = """
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank, world, port, out):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    out[rank] = t.item()
    dist.destroy_process_group()


@pytest.mark.device_count(2)
@pytest.mark.parametrize("i", range(8))
def test_all_reduce(i):
    port = int(os.environ.get("MASTER_PORT", "29500"))
    out = mp.Manager().dict()
    mp.spawn(_rank, args=(2, port, out), nprocs=2, join=True)
    assert dict(out) == {0: 3.0, 1: 3.0}
"""

GOLDEN_MODULE = """
import torch

X = torch.randn(1024, 1024)
GOLDEN = torch.softmax(X, dim=-1)  # a parallel op at import: OpenMP threads start here


def test_rows_sum_to_one():
    assert torch.allclose(torch.softmax(X, dim=-1).sum(dim=-1), torch.ones(1024), atol=1e-4)


def test_matches_golden():
    assert torch.equal(torch.softmax(X, dim=-1), GOLDEN)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--omp-threads",
        type=int,
        help="OMP_NUM_THREADS for every variant, plain pytest's too (torchrun's default for "
        "several processes on one host is 1)",
    )
    args = parser.parse_args()
    if args.omp_threads:
        os.environ["OMP_NUM_THREADS"] = str(args.omp_threads)
    if importlib.util.find_spec("torch") is None:
        print("torch_suite: torch is not installed in this interpreter; nothing measured")
        return
    files = {
        "conftest.py": CONFTEST,
        "test_cpu.py": CPU_MODULE,
        "test_models.py": MODEL_MODULE,
        "test_dist.py": DIST_MODULE,
        "test_golden.py": GOLDEN_MODULE,
    }
    with tempfile.TemporaryDirectory(prefix="devpool-torch-") as tmp:
        root = suite_root(Path(tmp), files)
        devpool = [*PYTEST, *devpool_options(root, "sim:0-3", root / "history.sqlite")]
        timed(devpool, root)  # the duration history, as on a developer's second run
        plain = Variant("plain pytest (serial)", [*PYTEST, "-p", "no:devpool"])
        warm = Variant("devpool, default (forked)", devpool)
        job = Variant("devpool, isolation job", [*devpool, "--devpool-isolation=job"])
        threads = os.environ.get("OMP_NUM_THREADS", "unset")
        print(
            "torch suite: 62 CPU, 32 one-device, 8 two-rank gloo tests; sim:0-3; "
            f"{os.cpu_count()} cores; OMP_NUM_THREADS {threads}"
        )
        alternate([plain, warm, job], root, args.repeat)
    print("  " + show_ratio(warm, plain, 1.2))
    print("  " + show_ratio(job, warm, 1.5))


if __name__ == "__main__":
    main()
