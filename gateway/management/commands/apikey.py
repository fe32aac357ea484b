from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils import timezone

from config.cli import SubcommandCommand
from scheduling.selectors import class_names_active
from tenants.models import ApiKey
from tenants.services import apikey_create, apikey_revoke, apikey_rotate


class Command(SubcommandCommand):
    help = "Create, revoke and list API keys. `create` prints the new key alone on stdout (shown once)."
    verbs = {
        "create": "create a key for a tenant",
        "revoke": "revoke a key by prefix",
        "rotate": "issue a new secret; the old one works for a grace period, then stops",
        "list": "list keys (prefixes only)",
    }

    def args_create(self, p):
        p.add_argument("slug")
        p.add_argument("--class", dest="default_class", required=True)
        p.add_argument("--label", default="")
        p.add_argument("--expires-days", type=int, default=None, help="the key stops working after this many days")

    def args_revoke(self, p):
        p.add_argument("prefix")

    def args_rotate(self, p):
        p.add_argument("prefix")
        p.add_argument(
            "--grace-hours",
            type=float,
            default=None,
            help="how long the old secret keeps working (default FAIRGATE_KEY_ROTATION_GRACE_H)",
        )

    def args_list(self, p):
        p.add_argument("slug", nargs="?")

    def do_create(self, *, slug, default_class, label, expires_days, **_):
        if expires_days is not None and expires_days < 1:
            raise ValidationError("--expires-days must be at least 1")
        expires_at = None if expires_days is None else timezone.now() + timedelta(days=expires_days)
        _created, full_key = apikey_create(
            tenant_slug=slug,
            default_class=default_class,
            label=label,
            actor="cli",
            known_classes=class_names_active(),
            expires_at=expires_at,
        )
        self.stdout.write(full_key)

    def do_rotate(self, *, prefix, grace_hours, **_):
        hours = settings.FAIRGATE_KEY_ROTATION_GRACE_H if grace_hours is None else grace_hours
        new, full_key = apikey_rotate(prefix=prefix, grace=timedelta(hours=hours), actor="cli")
        old = new.replaces.get()
        self.stderr.write(f"{prefix} keeps working until {old.expires_at}, then stops; the new key:")
        self.stdout.write(full_key)

    def do_revoke(self, *, prefix, **_):
        apikey_revoke(prefix=prefix, actor="cli")
        self.stdout.write(f"revoked {prefix}")

    def do_list(self, *, slug, **_):
        keys = ApiKey.objects.select_related("tenant").order_by("tenant__slug", "created_at")
        if slug:
            keys = keys.filter(tenant__slug=slug)
        columns = "{:<12} {:<16} {:<12} {:<9} {:<17} {:<17} {:<16} {}"
        header = ("prefix", "tenant", "class", "state", "expires", "last used", "created by", "label")
        self.stdout.write(columns.format(*header))
        for k in keys:
            expires = k.expires_at.strftime("%Y-%m-%d %H:%M") if k.expires_at else "never"
            used = k.last_used_at.strftime("%Y-%m-%d %H:%M") if k.last_used_at else "never"
            row = (k.prefix, k.tenant.slug, k.default_class, k.state, expires, used, k.created_by or "-", k.label)
            self.stdout.write(columns.format(*row))
