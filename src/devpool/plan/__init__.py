"""From markers to a plan: Requests, Jobs, the scheduler and its policies."""
