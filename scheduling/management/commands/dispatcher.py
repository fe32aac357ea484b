"""`manage.py dispatcher`: the shared scheduler's dispatcher alone, without serving HTTP.

By default every ``serve`` process with ``FAIRGATE_SCHEDULER=shared`` bids for the dispatcher's
role, so a deployment needs nothing else; this runs the role in a process of its own (start it
with the gateways set to ``FAIRGATE_DISPATCHER=never``, or beside them as one more bidder). It
follows the live configuration as the gateways do (``FAIRGATE_CONFIG_POLL_MS``).
"""

from __future__ import annotations

import asyncio
import signal

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from audit.models import AuditLog
from scheduling.selectors import config_live
from scheduling.shared.client import connect
from scheduling.shared.owner import Owner
from scheduling.shared.replica import Keys


class Command(BaseCommand):
    help = "Run the shared scheduler's dispatcher (FAIRGATE_SCHEDULER=shared) in this process."

    def handle(self, *args, **options):
        if settings.FAIRGATE_SCHEDULER != "shared":
            raise CommandError("the dispatcher runs with the shared scheduler: set FAIRGATE_SCHEDULER=shared")
        asyncio.run(self._run())

    async def _run(self) -> None:
        url = settings.REDIS_URL
        assert url, "config.settings refuses FAIRGATE_SCHEDULER=shared without REDIS_URL"
        client = connect(url)
        load = sync_to_async(config_live, thread_sensitive=True)
        owner = Owner(client, await load(), keys=Keys(settings.FAIRGATE_SHARED_PREFIX))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        self.stdout.write(f"dispatcher {owner.name} bidding on {settings.FAIRGATE_SHARED_PREFIX}")
        self.stdout.flush()

        latest = sync_to_async(lambda: AuditLog.objects.order_by("-pk").values_list("pk", flat=True).first())

        async def follow_config() -> None:  # as the gateways do: reloaded when the audit log moves
            seen = await latest()
            while not stop.is_set():
                await asyncio.sleep(settings.FAIRGATE_CONFIG_POLL_MS / 1000)
                try:
                    pk = await latest()
                    if pk != seen:
                        owner.configure(await load())
                        seen = pk
                except Exception as failed:  # a database hiccup: the dispatcher goes on with what it has
                    self.stderr.write(f"configuration poll failed: {failed!r}")

        watcher = loop.create_task(follow_config())
        try:
            await owner.run(stop=stop)
        finally:
            watcher.cancel()
            await client.aclose()
