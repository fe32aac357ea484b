"""`manage.py scheduler_config load FILE` / `dump [FILE]`."""

from __future__ import annotations

import sys
from pathlib import Path

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from scheduling.config_files import config_dump_text, config_load_file
from scheduling.engine.schema import ConfigError
from scheduling.prices import ConfirmNeeded


class Command(BaseCommand):
    help = "Load a scheduler YAML file into the live configuration, or dump the live one."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="verb", required=True)
        load = sub.add_parser("load", help="apply FILE atomically (sections present replace the live ones)")
        load.add_argument("file")
        load.add_argument("--actor", default="cli")
        load.add_argument(
            "--confirm", action="store_true", help="apply price factors moved more than 2x (refused without it)"
        )
        dump = sub.add_parser("dump", help="write the live configuration (stdout, or FILE)")
        dump.add_argument("file", nargs="?")

    def handle(self, *args, verb: str, **opts):
        if verb == "load":
            try:
                result = config_load_file(opts["file"], actor=opts["actor"], confirm=opts["confirm"])
            except ConfigError as exc:
                raise CommandError(f"configuration refused, nothing changed:\n{exc}", returncode=2) from None
            except ConfirmNeeded as asked:
                raise CommandError(
                    f"configuration refused, nothing changed: {asked.message} Run again with --confirm.", returncode=2
                ) from None
            except ValidationError as exc:
                raise CommandError(
                    f"configuration refused, nothing changed: {'; '.join(exc.messages)}", returncode=2
                ) from None
            if not result.changed:
                self.stdout.write("no changes")
            for change in result.changes:
                self.stdout.write(change)
            return
        text = config_dump_text()
        if opts.get("file"):
            Path(opts["file"]).write_text(text, encoding="utf-8")
            self.stderr.write(f"wrote {opts['file']}")
        else:
            sys.stdout.write(text)
