"""What the upgrade tests share: a previous commit's code, checked out and run as its own
processes, and today's code, on one scratch database (SQLite, or PostgreSQL when DATABASE_URL is)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

Manage = Callable[[list[str], dict], str]  # (manage.py arguments, environment) -> its stdout


def checkout(commit: str, into: Path) -> Path:
    """The repository's files at ``commit`` (``git archive``), in a new folder ``into``."""
    into.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def scratch_env(database_url: str, tmp_path: Path) -> dict[str, str]:
    """This process's environment for a ``manage.py`` on the scratch database (no PYTHONPATH: each
    checkout imports its own code)."""
    return {
        **{k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH")},
        "DATABASE_URL": database_url,
        "SECRET_KEY": "upgrade-test-only",
        "FAIRGATE_VAR_DIR": str(tmp_path / "var"),
        "DJANGO_SETTINGS_MODULE": "config.settings",
    }


def manage_in(where: Path) -> Manage:
    def run(args: list[str], env: dict) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=where, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, f"manage.py {args[0]} in {where.name} failed:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    return run


def marked(output: str, marker: str) -> str:
    return next(line for line in output.splitlines() if line.startswith(marker)).removeprefix(marker)


def tables_and_rows(run: Manage, env: dict) -> dict[str, int]:
    script = (
        "import json; from django.db import connection; "
        "c = connection.cursor(); names = connection.introspection.table_names(c); "
        "print('ROWS=' + json.dumps({n: c.execute(f'SELECT COUNT(*) FROM \"{n}\"').fetchone()[0] for n in names}))"
    )
    return json.loads(marked(run(["shell", "-c", script], env), "ROWS="))


# Models added after both upgrade tests' previous commits: today's migrate makes their (empty) tables,
# content types and permissions, which the tests take out before comparing (`without_later`).
LATER_MODELS = {"tenants": ("signinrule", "reporttoken"), "scheduling": ("learnedprofile",)}


LATER_SCRIPT = """
import json
from django.apps import apps
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db.models import Q
q = Q(pk__in=[])
for label, names in later.items():
    q |= Q(app_label=label, model__in=names)
types = ContentType.objects.filter(q)
tables = [apps.get_model(label, name)._meta.db_table for label, names in later.items() for name in names]
perms = Permission.objects.filter(content_type__in=types).count()
print("LATER=" + json.dumps({"tables": tables, "types": types.count(), "perms": perms}))
"""


def without_later(run: Manage, env: dict, counts: dict[str, int]) -> dict[str, int]:
    """``counts`` (`tables_and_rows` after the upgrade) without what LATER_MODELS add."""
    later = json.loads(marked(run(["shell", "-c", f"later = {LATER_MODELS!r}" + LATER_SCRIPT], env), "LATER="))
    kept = {table: rows for table, rows in counts.items() if table not in later["tables"]}
    kept["django_content_type"] -= later["types"]
    kept["auth_permission"] -= later["perms"]
    return kept
