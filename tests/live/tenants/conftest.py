from __future__ import annotations

import os

import pytest

from bench.launch import postgres_create, postgres_drop


@pytest.fixture
def scratch_database(tmp_path):
    """A database of its own for an upgrade test: PostgreSQL when DATABASE_URL is, else SQLite."""
    url = os.environ.get("DATABASE_URL", "")
    if url.startswith(("postgres://", "postgresql://")):
        made = postgres_create(url.rsplit("/", 1)[0], f"fg_upgrade_{os.getpid()}")
        yield made
        postgres_drop(made, attempts=3)
    else:
        yield f"sqlite:///{tmp_path / 'upgrade.sqlite3'}"
