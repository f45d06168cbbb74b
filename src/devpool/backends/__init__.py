"""Where workers run: local processes on this host, or Ray (later)."""
