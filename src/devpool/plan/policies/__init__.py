"""Scheduling policies, one per module, each satisfying devpool.plan.scheduler.Policy."""

from devpool.plan.policies.backfill import Backfill
from devpool.plan.policies.fifo import Fifo

__all__ = ["Backfill", "Fifo"]
