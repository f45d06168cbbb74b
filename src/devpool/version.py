"""devpool's version: in the baselines it writes (select/) and on its command line, and as
`devpool.__version__`. A module of its own, so that those import it without the package's
`__init__`, which imports select/ as it starts (select/children.py)."""

__version__ = "0.1.0"
