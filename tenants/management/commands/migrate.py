"""``manage.py migrate``, able to adopt a database made before identity moved to this app.

``tenants.0001_initial`` only declares models whose tables gateway.0001 made, and Django's admin
and auth migrations depend on it (it declares the user model). A database made before it existed
has those migrations applied and this one not, which ``migrate`` refuses as an inconsistent
history. Since the migration writes nothing, recording it as applied is all it would do: that is
done first, once, on such a database only; then Django's own ``migrate`` runs.
"""

from __future__ import annotations

from django.core.management.commands.migrate import Command as DjangoMigrate
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.recorder import MigrationRecorder

MOVE = ("tenants", "0001_initial")
MADE_BEFORE = ("gateway", "0001_initial")  # made the tables the move declares


def adopt_identity_move(alias: str = DEFAULT_DB_ALIAS) -> bool:
    """Records the state-only move as applied on a database whose tables predate it; True if it did."""
    recorder = MigrationRecorder(connections[alias])
    if not recorder.has_table():
        return False
    applied = recorder.applied_migrations()
    if MOVE in applied or MADE_BEFORE not in applied:
        return False
    recorder.record_applied(*MOVE)
    return True


class Command(DjangoMigrate):
    def handle(self, *args, **options):
        if adopt_identity_move(options["database"]) and options["verbosity"] >= 1:
            self.stdout.write("Adopted a database made before tenants: recorded tenants.0001_initial (state only).")
        return super().handle(*args, **options)
