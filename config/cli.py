"""Base for Fairgate's scripting commands: sub-commands, and user errors as one line with exit 2."""

from __future__ import annotations

import argparse
from decimal import Decimal, InvalidOperation

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError


class SubcommandCommand(BaseCommand):
    """Subclasses define `verbs = {"create": (add_args_fn, handler_method_name), ...}`."""

    verbs: dict[str, str] = {}

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="verb", required=True)
        for verb, help_text in self.verbs.items():
            getattr(self, f"args_{verb}")(sub.add_parser(verb, help=help_text))

    def handle(self, *args, verb: str, **opts):
        try:
            getattr(self, f"do_{verb}")(**opts)
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages), returncode=2) from None


def decimal_arg(value: str):
    try:
        return Decimal(value)
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"{value!r} is not a decimal number") from None


def class_list_arg(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]
