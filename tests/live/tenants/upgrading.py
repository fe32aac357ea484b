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
