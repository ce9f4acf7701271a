"""Chaos: fault schedules as data, run against the example job, checked for exactly-once and parameters."""
