"""The tenant foreign keys point at tenants.Tenant (state only: the same table, the same constraints)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0004_ledger_unbilled_owner"),
        ("tenants", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="budget",
                    name="tenant",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="budgets", to="tenants.tenant"
                    ),
                ),
                migrations.AlterField(
                    model_name="ledgerentry",
                    name="tenant",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="ledger_entries",
                        to="tenants.tenant",
                    ),
                ),
                migrations.AlterField(
                    model_name="tenantbilling",
                    name="tenant",
                    field=models.OneToOneField(
                        on_delete=django.db.models.deletion.PROTECT, related_name="billing", to="tenants.tenant"
                    ),
                ),
            ],
            database_operations=[],
        ),
    ]
