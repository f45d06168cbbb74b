"""Issue 12 on a GPU host: 40 one-line CUDA tests under warm workers, isolation=module and
isolation=job, and what a CUDA context costs a forked child on its own.

Run (a CUDA host with torch): python benchmarks/gpu_isolation.py [--repeat 3]

The suite is 4 modules of 10 tests; each module imports torch and each test puts one
tensor on its GPU. Variants alternate within each repetition: plain pytest (one process,
one GPU), devpool on warm workers, `--devpool-isolation module`, `--devpool-isolation job`
(forked from a template that imported torch), and job isolation with
`--devpool-no-fork-server` (a new interpreter per test). Target: isolation=job under 1 s a
test over warm workers. The CUDA context's own start in a forked child is measured apart:
no fork server can avoid it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import PYTEST, Variant, alternate, devpool_options, show_ratio, suite_root

MODULE = """
import pytest
import torch

@pytest.mark.device_count(1)
@pytest.mark.parametrize("i", range({tests}))
def test_cuda(i):
    assert torch.full((4,), i, device="cuda").sum().item() == 4 * i
"""


def context_cost(samples: int) -> list[float]:
    """Seconds from fork to a first CUDA tensor, in children of a process that imported torch."""
    import torch

    costs = []
    for _ in range(samples):
        read, write = os.pipe()
        began = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            torch.ones(1, device="cuda")
            torch.cuda.synchronize()
            os.write(write, b"x")
            os._exit(0)
        os.read(read, 1)
        costs.append(time.perf_counter() - began)
        os.waitpid(pid, 0)
        os.close(read)
        os.close(write)
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        sys.exit("gpu_isolation: torch is not installed")
    if not torch.cuda.is_available():
        sys.exit("gpu_isolation: no CUDA device")
    files = {f"test_cuda{m}.py": MODULE.format(tests=10) for m in range(4)}
    with tempfile.TemporaryDirectory(prefix="devpool-gpu-isolation-") as tmp:
        root = suite_root(Path(tmp), files)
        base = [*PYTEST, *devpool_options(root, "auto", root / "h.sqlite")]
        variants = [
            Variant("plain pytest", [*PYTEST]),
            Variant("devpool, warm workers (forked, the default)", base),
            Variant(
                "devpool, warm workers, fresh interpreters",
                [*base, "--devpool-no-fork-server"],
            ),
            Variant("devpool, isolation=module", [*base, "--devpool-isolation", "module"]),
            Variant("devpool, isolation=job", [*base, "--devpool-isolation", "job"]),
            Variant(
                "devpool, isolation=job, fresh interpreters",
                [*base, "--devpool-isolation", "job", "--devpool-no-fork-server"],
            ),
        ]
        print("4 modules importing torch, 40 one-line CUDA tests")
        alternate(variants, root, args.repeat)
    _, warm, warm_fresh, module, job, fresh = variants
    for isolated in (warm_fresh, module, job, fresh):
        print(show_ratio(isolated, warm))
        cost = (isolated.median - warm.median) / 40
        print(f"  {isolated.name}: {cost * 1000:.0f} ms a test over warm workers")
    costs = context_cost(5)
    print(
        f"CUDA context in a forked child: median {statistics.median(costs) * 1000:.0f} ms "
        f"({min(costs) * 1000:.0f}–{max(costs) * 1000:.0f} ms over {len(costs)})"
    )


if __name__ == "__main__":
    main()
