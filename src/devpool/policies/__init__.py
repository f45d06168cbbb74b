"""Scheduling policies, one per module, each satisfying devpool.scheduler.Policy."""

from devpool.policies.backfill import Backfill
from devpool.policies.fifo import Fifo

__all__ = ["Backfill", "Fifo"]
