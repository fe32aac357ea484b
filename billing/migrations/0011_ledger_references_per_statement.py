"""PostgreSQL: the ledger's references are checked once per statement, not once per row.

A foreign key's check is a trigger per inserted row (a query and a row lock each): with four of them
on every ledger row, checking them cost the database more than the rest of a booking
(bench/REPORT-gateway-postgres.md, issue 47). They are replaced by triggers that refuse the same
things: an AFTER INSERT statement trigger locks the rows the new entries name, as a foreign key's
check does (FOR KEY SHARE, until commit), and refuses entries naming a row that does not exist; an
AFTER DELETE OR UPDATE OF id row trigger on each referenced table refuses to remove a row the
ledger names (NO ACTION, as the constraints did). Database only: Django's state keeps the foreign
keys, and SQLite keeps its constraints. A later migration that alters one of these four fields on
PostgreSQL must drop or re-create these triggers first (it would find no constraint to drop).
"""

from django.db import migrations

LEDGER = "billing_ledgerentry"
BUDGET = "billing_budget"
TENANT = "gateway_tenant"
PRICE_VERSION = "scheduling_priceversion"
# (column, referenced table), as the foreign keys named them
REFERENCES = (
    ("budget_id", BUDGET),
    ("month_budget_id", BUDGET),
    ("tenant_id", TENANT),
    ("price_version_id", PRICE_VERSION),
)
FIELDS = ("budget", "month_budget", "tenant", "price_version")
# referenced table -> its trigger's condition on the ledger ($1: the removed row's id)
REFERENCED = {
    BUDGET: "budget_id = $1 OR month_budget_id = $1",
    TENANT: "tenant_id = $1",
    PRICE_VERSION: "price_version_id = $1",
}

FORWARD = [
    f"""
    CREATE OR REPLACE FUNCTION billing_ledger_references() RETURNS trigger AS $$
    BEGIN
        PERFORM 1 FROM {BUDGET} WHERE id IN (SELECT budget_id FROM added UNION SELECT month_budget_id FROM added)
            FOR KEY SHARE;
        PERFORM 1 FROM {TENANT} WHERE id IN (SELECT tenant_id FROM added) FOR KEY SHARE;
        PERFORM 1 FROM {PRICE_VERSION} WHERE id IN (SELECT price_version_id FROM added) FOR KEY SHARE;
        IF EXISTS (
            SELECT 1 FROM (SELECT budget_id AS id FROM added UNION SELECT month_budget_id FROM added) r
            WHERE r.id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM {BUDGET} b WHERE b.id = r.id)
        ) OR EXISTS (
            SELECT 1 FROM (SELECT DISTINCT tenant_id AS id FROM added) r
            WHERE NOT EXISTS (SELECT 1 FROM {TENANT} t WHERE t.id = r.id)
        ) OR EXISTS (
            SELECT 1 FROM (SELECT DISTINCT price_version_id AS id FROM added) r
            WHERE r.id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM {PRICE_VERSION} p WHERE p.id = r.id)
        ) THEN
            RAISE EXCEPTION 'insert into {LEDGER} names a budget, tenant or price version that does not exist'
                USING ERRCODE = 'foreign_key_violation';
        END IF;
        RETURN NULL;
    END;
    $$ LANGUAGE plpgsql;
    """,
    f"""
    CREATE TRIGGER billing_ledger_references AFTER INSERT ON {LEDGER}
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION billing_ledger_references();
    """,
    f"""
    CREATE OR REPLACE FUNCTION billing_ledger_referenced() RETURNS trigger AS $$
    DECLARE
        named boolean;
    BEGIN
        IF TG_OP = 'UPDATE' AND NEW.id = OLD.id THEN
            RETURN NULL;
        END IF;
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM {LEDGER} WHERE %s)', TG_ARGV[0]) INTO named USING OLD.id;
        IF named THEN
            RAISE EXCEPTION '% of %.id % refused: {LEDGER} names it', TG_OP, TG_TABLE_NAME, OLD.id
                USING ERRCODE = 'foreign_key_violation';
        END IF;
        RETURN NULL;
    END;
    $$ LANGUAGE plpgsql;
    """,
    *(
        f"""
        CREATE TRIGGER billing_ledger_referenced AFTER DELETE OR UPDATE OF id ON {table}
        FOR EACH ROW EXECUTE FUNCTION billing_ledger_referenced('{condition}');
        """
        for table, condition in REFERENCED.items()
    ),
]
BACKWARD = [
    *(f"DROP TRIGGER IF EXISTS billing_ledger_referenced ON {table};" for table in REFERENCED),
    "DROP FUNCTION IF EXISTS billing_ledger_referenced();",
    f"DROP TRIGGER IF EXISTS billing_ledger_references ON {LEDGER};",
    "DROP FUNCTION IF EXISTS billing_ledger_references();",
]


def _foreign_keys(schema_editor) -> list[str]:
    """The names of the ledger's foreign key constraints on the four columns."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.conname FROM pg_constraint c JOIN pg_attribute a "
            "ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1] "
            "WHERE c.conrelid = %s::regclass AND c.contype = 'f' AND a.attname = ANY(%s)",
            [LEDGER, [column for column, _ in REFERENCES]],
        )
        return [name for (name,) in cursor.fetchall()]


def forward(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name in _foreign_keys(schema_editor):
        schema_editor.execute(f"ALTER TABLE {LEDGER} DROP CONSTRAINT {schema_editor.quote_name(name)}")
    for sql in FORWARD:
        schema_editor.execute(sql, params=None)  # no placeholders: "%" and "$1" are plpgsql's


def backward(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for sql in BACKWARD:
        schema_editor.execute(sql, params=None)
    if _foreign_keys(schema_editor):
        return
    model = apps.get_model("billing", "LedgerEntry")
    for name in FIELDS:
        schema_editor.execute(
            schema_editor._create_fk_sql(model, model._meta.get_field(name), "_fk_%(to_table)s_%(to_column)s")
        )


class Migration(migrations.Migration):
    dependencies = [("billing", "0010_ledger_spender")]

    operations = [migrations.RunPython(forward, backward)]
