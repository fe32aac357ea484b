"""PriceVersion moves here from the scheduling app: the model only (state), not the table.

The table keeps its name (``scheduling_priceversion``, made by scheduling.0001), its index and its
rows; the ledger's foreign key points at this app's model. Nothing is written to the database.
scheduling.0006 then removes the model from the scheduling app's state.
"""

from decimal import Decimal

import django.core.validators
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0005_tenant_fks_to_tenants"),
        ("scheduling", "0005_auditlog_to_audit"),  # the table exists, made by scheduling.0001
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="PriceVersion",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        (
                            "price_factor",
                            models.DecimalField(
                                decimal_places=4,
                                max_digits=8,
                                validators=[django.core.validators.MinValueValidator(Decimal("0"))],
                            ),
                        ),
                        ("effective_at", models.DateTimeField()),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("created_by", models.CharField(blank=True, max_length=150)),
                        (
                            "priority_class",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="prices",
                                to="scheduling.priorityclass",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "scheduling_priceversion",
                        "ordering": ["priority_class__level", "-effective_at", "-pk"],
                        "indexes": [
                            models.Index(
                                fields=["priority_class", "effective_at"], name="scheduling__priorit_2feb39_idx"
                            )
                        ],
                    },
                ),
                migrations.AlterField(
                    model_name="ledgerentry",
                    name="price_version",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="ledger_entries",
                        to="billing.priceversion",
                    ),
                ),
            ],
            database_operations=[],
        ),
    ]
