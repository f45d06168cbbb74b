"""devpool: run pytest suites whose tests need accelerators on shared hosts."""

__version__ = "0.1.0"
