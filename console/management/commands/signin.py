"""`manage.py signin dump|load [FILE]`: the company sign-in rules as YAML (docs/sign-in.md)."""

from __future__ import annotations

from django.core.exceptions import ValidationError

from audit.services import audit_record
from config.cli import SubcommandCommand
from tenants.signin import SignInRuleError, rules_as_dict, rules_dump, rules_load


class Command(SubcommandCommand):
    help = "Dump or load the sign-in rules (claim value -> tenant and role). Bad input exits with status 2."
    verbs = {"dump": "print the rules as YAML", "load": "replace every rule with a YAML file's"}

    def args_dump(self, p):
        pass

    def args_load(self, p):
        p.add_argument("file")

    def do_dump(self, **_):
        self.stdout.write(rules_dump(), ending="")

    def do_load(self, *, file, **_):
        before = rules_as_dict()["signin"]["rules"]
        try:
            count = rules_load(file)
        except SignInRuleError as err:
            raise ValidationError(str(err)) from None
        after = rules_as_dict()["signin"]["rules"]
        audit_record(actor="cli", action="load", entity="signin_rule", key=file, old=before, new=after)
        self.stdout.write(f"loaded {count} sign-in rule{'s' if count != 1 else ''} from {file}")
