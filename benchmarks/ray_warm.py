"""Warm workers on Ray nodes (issue 31 item 3): a two-node loopback cluster against one host.

40 one-device tests of 0.1 s each on 8 simulated devices: once on this host
(`--devices sim:0-7`, the local backend), once on a two-node loopback Ray cluster of
4 devices per node (`--devpool-backend ray`), with ranks forked from each node's templates
(the default) and as fresh interpreters (`--devpool-no-fork-server`). All have the duration
history of an earlier run; the variants alternate within each repetition. Target: Ray ≤
1.3× local.

    python benchmarks/ray_warm.py [--repeat 3] [--tests 40]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # every Ray process on 127.0.0.1

from common import PYTEST, Variant, alternate, devpool_options, show_ratio, suite_root, timed

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# benchmarks/concurrent.py would stand for the standard library's concurrent in Ray's
# imports: the tests' loopback cluster is imported without this folder on the path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(ROOT / "tests"))

from ray_nodes import two_node_cluster  # noqa: E402

PYPROJECT = """
[tool.devpool.platforms]
sim = { kind = "sim", ray-resource = "NPU" }
"""


def suite(tests: int) -> dict[str, str]:
    body = (
        "import time\n\nimport pytest\n\n\n"
        f"@pytest.mark.parametrize('i', range({tests}))\n"
        "@pytest.mark.device_count(1)\n"
        "def test_one_device(i):\n"
        "    time.sleep(0.1)\n"
    )
    return {"test_one_device.py": body, "pyproject.toml": PYPROJECT}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tests", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="devpool-raynodes-") as tmp, two_node_cluster() as c:
        root = suite_root(Path(tmp), suite(args.tests))
        local_opts = devpool_options(root, "sim:0-7", root / "local.sqlite")
        ray_opts = [
            *devpool_options(root, "sim", root / "ray.sqlite"),
            "--devpool-backend=ray",
            f"--devpool-ray-address={c.address}",
        ]
        local = Variant("local backend, sim:0-7", [*PYTEST, *local_opts])
        ray = Variant("Ray, 2 nodes x 4 sim", [*PYTEST, *ray_opts])
        fresh = Variant("Ray, fresh interpreters", [*PYTEST, *ray_opts, "--devpool-no-fork-server"])
        for variant in (local, ray, fresh):
            timed(variant.argv, root)  # the duration history; not counted
        alternate([local, ray, fresh], root, args.repeat)
        print(show_ratio(ray, local, target=1.3))
        print(show_ratio(fresh, local))
        print(show_ratio(ray, fresh))


if __name__ == "__main__":
    main()
