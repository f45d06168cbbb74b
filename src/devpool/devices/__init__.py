"""Devices: inventory and detection, the lock folder, leases, shares, memory, probes, fair share."""
