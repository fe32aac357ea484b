"""The `fairgate` console script (and manage.py): Django's command line on config.settings."""

from __future__ import annotations

import os
import sys

from django.core.management import execute_from_command_line


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    execute_from_command_line(sys.argv if argv is None else argv)
