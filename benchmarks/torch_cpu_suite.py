"""The CPU majority of an ML suite (issue 45): 1,200 torch CPU tests against plain pytest.

An image library's kind of suite, generated: many small ops on small tensors (filters,
colour conversions, resizes, warps, reductions) and gradchecks on tiny double tensors,
20 modules of 60 tests, a conftest that imports torch. No test needs a device, and no
variable is set by the user: devpool runs it out of the box. Variants alternate:

- plain pytest, serial (devpool installed, not on);
- devpool --devices auto (here: no accelerator, CPU tests only), its thread budget;
- the same with OMP_NUM_THREADS set to the host's cores: every worker's torch as wide as
  the host, as before the budget (the budget keeps a variable the user set);
- devpool --devpool-isolation job (a process per test, forked from a warm template);
- pytest-xdist -n <cores>.

Targets: devpool ≤ 0.75x plain; job isolation ≤ 1.5x devpool's default mode.

    python benchmarks/torch_cpu_suite.py [--repeat 3] [--modules 20]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
from pathlib import Path

from common import PYTEST, Variant, alternate, show_ratio, suite_root

from devpool.devices.cores import usable_cores

CONFTEST = "import torch  # noqa: F401\n"

MODULE = """
import pytest
import torch
import torch.nn.functional as F

torch.manual_seed({seed})
IMAGES = [torch.rand(2, 3, 32 + 8 * (i % 4), 32 + 8 * (i % 3)) for i in range(12)]


def gaussian(image, sigma):
    size = 5
    x = torch.arange(size, dtype=image.dtype) - size // 2
    k = torch.exp(-(x**2) / (2 * sigma**2))
    k = (k / k.sum())[None, :] * (k / k.sum())[:, None]
    weight = k.expand(image.shape[1], 1, size, size)
    return F.conv2d(F.pad(image, (2, 2, 2, 2), mode="reflect"), weight, groups=image.shape[1])


def rgb_to_gray(image):
    r, g, b = image.unbind(1)
    return (0.299 * r + 0.587 * g + 0.114 * b)[:, None]


@pytest.mark.parametrize("i", range(12))
@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0])
def test_blur_keeps_mean(i, sigma):
    image = IMAGES[i]
    blurred = gaussian(image, sigma)
    assert blurred.shape == image.shape
    assert torch.allclose(blurred.mean(), image.mean(), atol=2e-2)


@pytest.mark.parametrize("i", range(8))
def test_gray_in_range(i):
    gray = rgb_to_gray(IMAGES[i])
    assert gray.min() >= 0 and gray.max() <= 1


@pytest.mark.parametrize("i", range(5))
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_resize_round_trip(i, mode):
    image = IMAGES[i]
    up = F.interpolate(image, scale_factor=2, mode=mode)
    down = F.avg_pool2d(up, 2)
    assert torch.allclose(down.mean(), image.mean(), atol=2e-2)


@pytest.mark.parametrize("i", range(3))
def test_warp_identity(i):
    image = IMAGES[i]
    theta = torch.eye(2, 3)[None].expand(image.shape[0], 2, 3)
    grid = F.affine_grid(theta, list(image.shape), align_corners=False)
    assert torch.allclose(F.grid_sample(image, grid, align_corners=False), image, atol=1e-5)


@pytest.mark.parametrize("sigma", [0.7, 1.3, 1.9])
def test_blur_gradcheck(sigma):
    image = torch.rand(1, 2, 6, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: gaussian(t, sigma), (image,))
"""


def suite_files(modules: int) -> dict[str, str]:
    """The suite's files: its conftest and `modules` modules of 60 tests."""
    files = {"conftest.py": CONFTEST}
    files.update({f"test_ops_{n:02}.py": MODULE.format(seed=n) for n in range(modules)})
    return files


def suite_arguments(script: str, doc: str) -> argparse.Namespace | None:
    """--repeat and --modules; None (and a line saying so) where torch is not installed."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--modules", type=int, default=20, help="60 tests each")
    args = parser.parse_args()
    if importlib.util.find_spec("torch") is None:
        print(f"{script}: torch is not installed in this interpreter; nothing measured")
        return None
    return args


def main() -> None:
    args = suite_arguments("torch_cpu_suite", __doc__ or "")
    if args is None:
        return
    if importlib.util.find_spec("xdist") is None:
        print("torch_cpu_suite: pytest-xdist is not installed; nothing measured")
        return
    cores = usable_cores().count
    files = suite_files(args.modules)
    with tempfile.TemporaryDirectory(prefix="devpool-torch-cpu-") as tmp:
        root = suite_root(Path(tmp), files)
        devpool = [
            *PYTEST,
            "--devices",
            "auto",
            f"--devpool-lock-dir={root / 'locks'}",
            f"--devpool-history={root / 'history.sqlite'}",
        ]
        plain = Variant("plain pytest (serial)", [*PYTEST, "-p", "no:devpool"])
        budget = Variant("devpool --devices auto", devpool)
        wide = Variant(f"devpool, OMP_NUM_THREADS={cores}", ["env", f"OMP_NUM_THREADS={cores}"])
        wide.argv += devpool
        job = Variant("devpool, isolation job", [*devpool, "--devpool-isolation=job"])
        xdist = Variant(f"pytest-xdist -n {cores}", [*PYTEST, "-p", "no:devpool", "-n", str(cores)])
        print(
            f"torch CPU suite: {60 * args.modules} tests in {args.modules} modules; "
            f"{usable_cores().describe()}; OMP_NUM_THREADS "
            f"{os.environ.get('OMP_NUM_THREADS', 'unset')}"
        )
        alternate([plain, budget, wide, job, xdist], root, args.repeat)
    print(show_ratio(budget, plain, 0.75))
    print(show_ratio(wide, plain))
    print(show_ratio(job, budget, 1.5))
    print(show_ratio(xdist, plain))


if __name__ == "__main__":
    main()
