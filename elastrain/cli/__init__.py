"""The `elastrain` command."""
