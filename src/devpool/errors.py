"""Errors a user can cause: each carries one sentence that names what was wrong."""


class DevpoolError(Exception):
    """A mistake in the user's input (option, marker, config file, folder); exit code 4."""
