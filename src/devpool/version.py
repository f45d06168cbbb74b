"""devpool's version: in the baselines it writes (select/) and on its command line, and as
`devpool.__version__`. A module of its own, so that those import it without the package's
`__init__`, which imports select/ as it starts (select/below.py). The one place it is
written: pyproject.toml reads it from here (`dynamic`)."""

__version__ = "0.1.0"
