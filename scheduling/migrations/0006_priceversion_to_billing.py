"""PriceVersion leaves the scheduling app's state (billing.0006 declared it there, and pointed the
ledger at it). State only: the table ``scheduling_priceversion`` is not renamed, dropped or touched.
Its content type is renamed to the billing app, so permissions and admin history keep pointing at it."""

from django.db import migrations

MOVED = ("priceversion",)


def _content_types(apps, schema_editor, *, to: str, away: str) -> None:
    ContentType = apps.get_model("contenttypes", "ContentType")
    types = ContentType.objects.using(schema_editor.connection.alias)
    for model in MOVED:
        if not types.filter(app_label=to, model=model).exists():
            types.filter(app_label=away, model=model).update(app_label=to)


def content_types_to_billing(apps, schema_editor):
    _content_types(apps, schema_editor, to="billing", away="scheduling")


def content_types_to_scheduling(apps, schema_editor):
    _content_types(apps, schema_editor, to="scheduling", away="billing")


class Migration(migrations.Migration):
    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("scheduling", "0005_auditlog_to_audit"),
        ("billing", "0006_priceversion_from_scheduling"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="PriceVersion")],
            database_operations=[],
        ),
        migrations.RunPython(content_types_to_billing, content_types_to_scheduling),
    ]
