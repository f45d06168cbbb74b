"""The one compiled part of devpool: select/_calls.c, the frame-evaluation hook a recording
run uses on Python 3.11 (3.12 has sys.monitoring; 3.10 uses cProfile). Optional: without a
compiler, or with DEVPOOL_PURE_PYTHON=1 (a wheel for any Python), 3.11 uses cProfile too."""

import os
import sys

from setuptools import Extension, setup

native = sys.version_info[:2] == (3, 11) and not os.environ.get("DEVPOOL_PURE_PYTHON")
calls = Extension("devpool.select._calls", ["src/devpool/select/_calls.c"], optional=True)
setup(ext_modules=[calls] if native else [])
