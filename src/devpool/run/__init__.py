"""The dispatch loop and what it routes: attempts, placing, pool, health, replay."""
