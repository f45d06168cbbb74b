"""Device detection per platform: which ids, and how much memory, this host's vendor tools see.

One module per kind (`cuda`, `rocm`, `ascend`); sim is never detected. The dispatch by kind
is `devices.inventory.detect` and `devices.inventory.device_memory`.
"""
