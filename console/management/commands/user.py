"""`manage.py user create USERNAME --role member|finance|admin [--tenant SLUG] [--password-stdin]`."""

from __future__ import annotations

import sys

from django.core.exceptions import ValidationError

from config.cli import SubcommandCommand
from console.services import user_create
from tenants.models import User


class Command(SubcommandCommand):
    help = "Create console users. Bad input exits with status 2 and one line saying why."
    verbs = {"create": "create a user with a role (and a tenant for members)"}

    def args_create(self, p):
        p.add_argument("username")
        p.add_argument("--role", required=True, choices=[r.value for r in User.Role])
        p.add_argument("--tenant", default=None, help="tenant slug (required for members)")
        p.add_argument("--email", default="")
        p.add_argument(
            "--password-stdin",
            action="store_true",
            help="read the password from the first line of standard input (else: no usable password)",
        )

    def do_create(self, *, username, role, tenant, email, password_stdin, **_):
        password = None
        if password_stdin:
            password = sys.stdin.readline().rstrip("\r\n")
            if not password:
                raise ValidationError("--password-stdin given but standard input had no password")
        user = user_create(
            username=username, role=role, tenant_slug=tenant, email=email, password=password, actor="cli"
        )
        where = f" of tenant {user.tenant.slug}" if user.tenant else ""
        self.stdout.write(f"created {user.role} {user.username}{where}")
