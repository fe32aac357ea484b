"""`manage.py reporttoken create USERNAME [--label L] [--days N]` and `revoke PREFIX`: report tokens
for scripts (the token is printed once). Bad input exits with status 2."""

from __future__ import annotations

from django.core.exceptions import ValidationError

from audit.services import audit_record
from config.cli import SubcommandCommand
from tenants.models import ReportToken, User
from tenants.tokens import DAYS_DEFAULT, token_create, token_revoke


class Command(SubcommandCommand):
    help = "Create or revoke report tokens (read-only access to the report API for scripts)."
    verbs = {"create": "create a token for a user (printed once)", "revoke": "revoke a token by its prefix"}

    def args_create(self, p):
        p.add_argument("username")
        p.add_argument("--label", default="")
        p.add_argument("--days", type=int, default=DAYS_DEFAULT)

    def args_revoke(self, p):
        p.add_argument("prefix")

    def do_create(self, *, username, label, days, **_):
        user = User.objects.filter(username=username).first()
        if user is None:
            raise ValidationError(f"no user {username!r}")
        full, token = token_create(user=user, label=label, days=days)
        audit_record(
            actor="cli",
            action="create",
            entity="report_token",
            key=token.prefix,
            new={"user": username, "label": label, "expires_at": token.expires_at.isoformat()},
        )
        self.stdout.write(full)

    def do_revoke(self, *, prefix, **_):
        token = ReportToken.objects.filter(prefix=prefix.removeprefix("fgr_").rstrip("…")).first()
        if token is None:
            raise ValidationError(f"no report token {prefix!r}")
        if token_revoke(token):
            audit_record(actor="cli", action="revoke", entity="report_token", key=token.prefix)
            self.stdout.write(f"revoked fgr_{token.prefix}…")
        else:
            self.stdout.write(f"fgr_{token.prefix}… was already revoked")
