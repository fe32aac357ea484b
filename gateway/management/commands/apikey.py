from config.cli import SubcommandCommand
from scheduling.selectors import class_names_active
from tenants.models import ApiKey
from tenants.services import apikey_create, apikey_revoke


class Command(SubcommandCommand):
    help = "Create, revoke and list API keys. `create` prints the new key alone on stdout (shown once)."
    verbs = {
        "create": "create a key for a tenant",
        "revoke": "revoke a key by prefix",
        "list": "list keys (prefixes only)",
    }

    def args_create(self, p):
        p.add_argument("slug")
        p.add_argument("--class", dest="default_class", required=True)
        p.add_argument("--label", default="")

    def args_revoke(self, p):
        p.add_argument("prefix")

    def args_list(self, p):
        p.add_argument("slug", nargs="?")

    def do_create(self, *, slug, default_class, label, **_):
        _created, full_key = apikey_create(
            tenant_slug=slug, default_class=default_class, label=label, actor="cli", known_classes=class_names_active()
        )
        self.stdout.write(full_key)

    def do_revoke(self, *, prefix, **_):
        apikey_revoke(prefix=prefix, actor="cli")
        self.stdout.write(f"revoked {prefix}")

    def do_list(self, *, slug, **_):
        keys = ApiKey.objects.select_related("tenant").order_by("tenant__slug", "created_at")
        if slug:
            keys = keys.filter(tenant__slug=slug)
        self.stdout.write(f"{'prefix':<12} {'tenant':<16} {'class':<12} {'state':<8} label")
        for k in keys:
            state = "active" if k.is_active else "revoked"
            self.stdout.write(f"{k.prefix:<12} {k.tenant.slug:<16} {k.default_class:<12} {state:<8} {k.label}")
