"""``python manage.py simbackend --port 9100 [--slots 8] ...``: run the simulated GPU backend."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from simbackend import add_arguments, run


class Command(BaseCommand):
    help = "Run the simulated OpenAI-compatible GPU backend (slots, TPM/RPM limits, failures)."

    def add_arguments(self, parser: CommandParser) -> None:
        add_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            run(options)
        except ValueError as err:
            raise CommandError(str(err)) from err
