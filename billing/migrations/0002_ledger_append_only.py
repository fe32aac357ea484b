"""Ledger entries are append-only in the database too: UPDATE and DELETE raise, even in raw SQL.

(TRUNCATE is left to the database owner: the test runner flushes tables with it.)
"""

from django.db import migrations

TABLE = "billing_ledgerentry"
MESSAGE = "billing_ledgerentry is append-only: post an adjustment instead"

POSTGRES_FORWARD = [
    f"""
    CREATE OR REPLACE FUNCTION billing_ledger_append_only() RETURNS trigger AS $$
    BEGIN
        RAISE EXCEPTION '{MESSAGE} (% refused)', TG_OP USING ERRCODE = 'integrity_constraint_violation';
    END;
    $$ LANGUAGE plpgsql;
    """,
    f"""
    CREATE TRIGGER billing_ledger_append_only BEFORE UPDATE OR DELETE ON {TABLE}
    FOR EACH ROW EXECUTE FUNCTION billing_ledger_append_only();
    """,
]
POSTGRES_BACKWARD = [
    f"DROP TRIGGER IF EXISTS billing_ledger_append_only ON {TABLE};",
    "DROP FUNCTION IF EXISTS billing_ledger_append_only();",
]
SQLITE_FORWARD = [
    f"""
    CREATE TRIGGER billing_ledger_no_{op.lower()} BEFORE {op} ON {TABLE}
    BEGIN SELECT RAISE(ABORT, '{MESSAGE} ({op} refused)'); END;
    """
    for op in ("UPDATE", "DELETE")
]
SQLITE_BACKWARD = [f"DROP TRIGGER IF EXISTS billing_ledger_no_{op};" for op in ("update", "delete")]


def _run(statements_by_vendor):
    def run(apps, schema_editor):
        statements = statements_by_vendor.get(schema_editor.connection.vendor)
        if statements is None:
            raise RuntimeError(f"no append-only trigger for {schema_editor.connection.vendor}; add one here")
        for sql in statements:
            schema_editor.execute(sql, params=None)  # no placeholders: "%" is plpgsql

    return run


class Migration(migrations.Migration):
    dependencies = [("billing", "0001_initial")]

    operations = [
        migrations.RunPython(
            _run({"postgresql": POSTGRES_FORWARD, "sqlite": SQLITE_FORWARD}),
            _run({"postgresql": POSTGRES_BACKWARD, "sqlite": SQLITE_BACKWARD}),
        ),
    ]
