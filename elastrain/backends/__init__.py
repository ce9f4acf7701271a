"""Where containers live: the `Backend` ABC and its implementations (local for now)."""
