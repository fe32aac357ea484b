"""`manage.py ledger verify`: recompute every budget's spent/held from the ledger (exit 1 on mismatch).
`manage.py ledger sweep`: release crash leftovers now, as beat's sweep does: the holds of dead
gateway processes, and holds with no owner older than FAIRGATE_BILLING_STALE_HOLD_S (or --older-than-s N).
`manage.py ledger release-forced --older-than-s N`: release every open hold older than N seconds,
even one whose process lives (its request is then charged only what its budget has left).
`manage.py ledger adjust TENANT AMOUNT --reason R --author A`: post a correction."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal, InvalidOperation

from django.core.management.base import BaseCommand, CommandError

from billing.errors import BillingError
from billing.heartbeats import holds_release_orphaned, holds_release_unowned
from billing.models import Budget, LedgerEntry
from billing.selectors import ledger_mismatches
from billing.services import holds_release_forced, ledger_adjust


class Command(BaseCommand):
    help = "Check and maintain the billing ledger."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("verify", help="recompute every budget from the ledger; exit 1 on any mismatch")
        sweep = sub.add_parser("sweep", help="release holds of dead processes, and unowned ones past their age")
        sweep.add_argument("--older-than-s", type=int, default=None, help="the age of unowned holds released")
        forced = sub.add_parser("release-forced", help="release every open hold older than N s, live owner or not")
        forced.add_argument("--older-than-s", type=int, required=True)
        adjust = sub.add_parser("adjust", help="post an adjustment (positive charges, negative credits)")
        adjust.add_argument("tenant")
        adjust.add_argument("amount")
        adjust.add_argument("--reason", required=True)
        adjust.add_argument("--author", required=True)

    def handle(self, *args, action: str, **options):
        getattr(self, f"_{action.replace('-', '_')}")(**options)

    def _verify(self, **options) -> None:
        mismatches = ledger_mismatches()
        budgets = Budget.objects.count()
        entries = LedgerEntry.objects.count()
        if mismatches:
            for mismatch in mismatches:
                self.stderr.write(f"MISMATCH {mismatch}")
            raise CommandError(f"{len(mismatches)} mismatch(es) in {budgets} budgets ({entries} entries)", returncode=1)
        self.stdout.write(f"ok: {budgets} budgets match {entries} ledger entries")

    def _sweep(self, *, older_than_s: int | None, **options) -> None:
        orphaned = holds_release_orphaned()
        age = None if older_than_s is None else timedelta(seconds=older_than_s)
        unowned = holds_release_unowned(older_than=age)
        self.stdout.write(f"released {orphaned} holds of dead processes and {unowned} stale holds with no owner")

    def _release_forced(self, *, older_than_s: int, **options) -> None:
        age = timedelta(seconds=older_than_s)
        self.stdout.write(f"released {holds_release_forced(older_than=age)} open holds older than {age}, forced")

    def _adjust(self, *, tenant: str, amount: str, reason: str, author: str, **options) -> None:
        try:
            entry = ledger_adjust(tenant_slug=tenant, amount=Decimal(amount), reason=reason, author=author)
        except (InvalidOperation, BillingError) as exc:
            raise CommandError(str(exc) or "bad amount", returncode=2) from None
        self.stdout.write(f"adjustment {entry.pk}: {entry.amount} on {entry.budget}")
