"""AuditLog leaves the scheduling app's state (audit.0001 declared it there). State only: the
table ``scheduling_auditlog`` is not renamed, dropped or touched. Its content type is renamed to
the audit app, so permissions and admin history keep pointing at it."""

from django.db import migrations

MOVED = ("auditlog",)


def _content_types(apps, schema_editor, *, to: str, away: str) -> None:
    ContentType = apps.get_model("contenttypes", "ContentType")
    types = ContentType.objects.using(schema_editor.connection.alias)
    for model in MOVED:
        if not types.filter(app_label=to, model=model).exists():
            types.filter(app_label=away, model=model).update(app_label=to)


def content_types_to_audit(apps, schema_editor):
    _content_types(apps, schema_editor, to="audit", away="scheduling")


def content_types_to_scheduling(apps, schema_editor):
    _content_types(apps, schema_editor, to="scheduling", away="audit")


class Migration(migrations.Migration):
    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("scheduling", "0004_backend_upstream"),
        ("audit", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="AuditLog")],
            database_operations=[],
        ),
        migrations.RunPython(content_types_to_audit, content_types_to_scheduling),
    ]
