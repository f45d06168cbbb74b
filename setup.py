"""Two parts of devpool that are not plain package files:

- select/_calls.c, the frame-evaluation hook a recording run uses on Python 3.11 (3.12 has
  sys.monitoring; 3.10 uses cProfile). Optional: without a compiler, or with
  DEVPOOL_PURE_PYTHON=1 (a wheel for any Python), 3.11 uses cProfile too.
- devpool-children.pth, installed beside the package: as any Python process of the
  environment starts below a recording worker (DEVPOOL_RECORD_CHILDREN set), it watches
  what that process runs of the project (select/children.py); elsewhere it reads one
  environment variable and does nothing else.
"""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

PTH = "devpool-children.pth"


class BuildWithPth(build_py):
    """build_py, and the .pth at the top of what is installed (a wheel's root)."""

    def run(self) -> None:
        super().run()
        self.copy_file(os.path.join("src", PTH), os.path.join(self.build_lib, PTH))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


native = sys.version_info[:2] == (3, 11) and not os.environ.get("DEVPOOL_PURE_PYTHON")
calls = Extension("devpool.select._calls", ["src/devpool/select/_calls.c"], optional=True)
setup(ext_modules=[calls] if native else [], cmdclass={"build_py": BuildWithPth})
