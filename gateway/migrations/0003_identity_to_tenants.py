"""Tenant, User and ApiKey leave the gateway app's state (tenants.0001 declared them there); the
downgrade events' foreign key points at tenants.Tenant. State only: no table is renamed, dropped
or touched. The content types of the three models are renamed to the tenants app, so
permissions and admin history keep pointing at them."""

import django.db.models.deletion
from django.db import migrations, models

MOVED = ("tenant", "user", "apikey")


def _content_types(apps, schema_editor, *, to: str, away: str) -> None:
    ContentType = apps.get_model("contenttypes", "ContentType")
    types = ContentType.objects.using(schema_editor.connection.alias)
    for model in MOVED:
        if not types.filter(app_label=to, model=model).exists():
            types.filter(app_label=away, model=model).update(app_label=to)


def content_types_to_tenants(apps, schema_editor):
    _content_types(apps, schema_editor, to="tenants", away="gateway")


def content_types_to_gateway(apps, schema_editor):
    _content_types(apps, schema_editor, to="gateway", away="tenants")


class Migration(migrations.Migration):
    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("gateway", "0002_downgrade_event"),
        ("tenants", "0001_initial"),
        ("billing", "0005_tenant_fks_to_tenants"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="downgradeevent",
                    name="tenant",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="downgrades", to="tenants.tenant"
                    ),
                ),
                migrations.DeleteModel(name="ApiKey"),
                migrations.DeleteModel(name="User"),
                migrations.DeleteModel(name="Tenant"),
            ],
            database_operations=[],
        ),
        migrations.RunPython(content_types_to_tenants, content_types_to_gateway),
    ]
