"""Selective runs: record what each test depended on, keep baselines, select from a diff.

record.py (in the worker), fingerprints.py (code blocks, files, libraries), options.py
([tool.devpool.select]), baseline.py (manifest, generations), diff.py (classification),
session.py (the controller's plugin), cli.py (`devpool select`).
"""

DEPENDS_ON_MARKER = (
    "depends_on(*globs): files (globs relative to the rootdir) the test reads; "
    "a change to one selects the test (devpool --devpool-select)."
)
