"""Control-plane state: SQLAlchemy 2 models, a session/repository helper and Alembic migrations."""
