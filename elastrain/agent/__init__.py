"""The agent: one per host (container). Spawns the host's workers, watches them, reports exits."""
