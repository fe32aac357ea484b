"""`manage.py ledger verify`: recompute every budget's spent/held from the ledger (exit 1 on mismatch).
`manage.py ledger sweep [--older-than-s N]`: release stale holds now.
`manage.py ledger adjust TENANT AMOUNT --reason R --author A`: post a correction."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal, InvalidOperation

from django.core.management.base import BaseCommand, CommandError

from billing.errors import BillingError
from billing.models import Budget, LedgerEntry
from billing.selectors import ledger_mismatches
from billing.services import holds_release_stale, ledger_adjust
from billing.tasks import stale_hold_age


class Command(BaseCommand):
    help = "Check and maintain the billing ledger."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("verify", help="recompute every budget from the ledger; exit 1 on any mismatch")
        sweep = sub.add_parser("sweep", help="release holds left behind by a crash")
        sweep.add_argument("--older-than-s", type=int, default=None)
        adjust = sub.add_parser("adjust", help="post an adjustment (positive charges, negative credits)")
        adjust.add_argument("tenant")
        adjust.add_argument("amount")
        adjust.add_argument("--reason", required=True)
        adjust.add_argument("--author", required=True)

    def handle(self, *args, action: str, **options):
        getattr(self, f"_{action}")(**options)

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
        age = stale_hold_age() if older_than_s is None else timedelta(seconds=older_than_s)
        self.stdout.write(f"released {holds_release_stale(older_than=age)} stale holds older than {age}")

    def _adjust(self, *, tenant: str, amount: str, reason: str, author: str, **options) -> None:
        try:
            entry = ledger_adjust(tenant_slug=tenant, amount=Decimal(amount), reason=reason, author=author)
        except (InvalidOperation, BillingError) as exc:
            raise CommandError(str(exc) or "bad amount", returncode=2) from None
        self.stdout.write(f"adjustment {entry.pk}: {entry.amount} on {entry.budget}")
