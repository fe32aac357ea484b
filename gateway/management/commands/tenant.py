from config.cli import SubcommandCommand, class_list_arg, decimal_arg
from scheduling.selectors import class_names_active
from tenants.models import Tenant
from tenants.services import tenant_create, tenant_update


class Command(SubcommandCommand):
    help = "Create, list and update tenants (business units)."
    verbs = {"create": "create a tenant", "list": "list tenants", "update": "change a tenant"}

    def _common(self, p, *, create: bool):
        p.add_argument("slug")
        p.add_argument("--name", required=create)
        p.add_argument("--quota-share", type=decimal_arg, required=create)
        p.add_argument("--annual-budget", type=decimal_arg)
        p.add_argument("--classes", type=class_list_arg, help="comma-separated classes it may declare")
        vip = p.add_mutually_exclusive_group()
        vip.add_argument("--vip", dest="vip", action="store_true", default=None)
        if not create:
            vip.add_argument("--no-vip", dest="vip", action="store_false")
            p.add_argument("--active", dest="active", action="store_true", default=None)
            p.add_argument("--inactive", dest="active", action="store_false")

    def args_create(self, p):
        self._common(p, create=True)

    def args_update(self, p):
        self._common(p, create=False)

    def args_list(self, p):
        pass

    def do_create(self, *, slug, name, quota_share, annual_budget, classes, vip, **_):
        tenant = tenant_create(
            slug=slug,
            name=name,
            quota_share=quota_share,
            annual_budget=annual_budget,
            classes=classes,
            vip=bool(vip),
            actor="cli",
            known_classes=class_names_active(),
        )
        self.stdout.write(f"created tenant {tenant.slug}")

    def do_update(self, *, slug, name, quota_share, annual_budget, classes, vip, active, **_):
        changes = {"name": name, "quota_share": quota_share, "allowed_classes": classes, "vip": vip, "active": active}
        if annual_budget is not None:
            changes["annual_budget"] = annual_budget
        tenant_update(slug=slug, actor="cli", known_classes=class_names_active(), **changes)
        self.stdout.write(f"updated tenant {slug}")

    def do_list(self, **_):
        self.stdout.write(f"{'slug':<20} {'share':>7} {'budget':>14} {'vip':<4} {'active':<6} classes")
        for t in Tenant.objects.order_by("slug"):
            budget = "-" if t.annual_budget is None else f"{t.annual_budget:.2f}"
            classes = ",".join(t.allowed_classes) or "all"
            self.stdout.write(
                f"{t.slug:<20} {t.quota_share:>7} {budget:>14} {'yes' if t.vip else 'no':<4} "
                f"{'yes' if t.active else 'no':<6} {classes}"
            )
