"""Devices: inventory and detection, leases, shares, memory, probes, fair share."""
