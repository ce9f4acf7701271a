"""`elastrain run`: the launcher. Starts the coordinator, the local agents, and watches the hosts."""
