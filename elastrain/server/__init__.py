"""The control plane: FastAPI app (`/api/v1`), services, the reconciler and the `elastrain server` command."""
