"""AuditLog moves here from the scheduling app: the model only (state), not the table.

The table keeps its name (``scheduling_auditlog``, made by scheduling.0001) and its rows; nothing
is written to the database. scheduling.0005 then removes the model from the scheduling app's state.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("scheduling", "0004_backend_upstream"),  # the table exists, made by scheduling.0001
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="AuditLog",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("at", models.DateTimeField(auto_now_add=True, db_index=True)),
                        ("actor", models.CharField(max_length=150)),
                        ("action", models.CharField(max_length=32)),
                        ("entity", models.CharField(max_length=64)),
                        ("key", models.CharField(max_length=200)),
                        ("field", models.CharField(blank=True, max_length=64)),
                        ("old", models.JSONField(blank=True, null=True)),
                        ("new", models.JSONField(blank=True, null=True)),
                    ],
                    options={
                        "db_table": "scheduling_auditlog",
                        "ordering": ["-at", "-pk"],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
