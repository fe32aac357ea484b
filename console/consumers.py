"""The console's WebSocket: ``/ws/console/`` (``?tenant=SLUG`` is honoured for admins only).

Authenticated by the session (``AuthMiddlewareStack``), origin checked in ``config.asgi``. The
groups a socket joins are decided here from the user alone; what the client sends can only pick
a request id of its own tenant to follow (``{"type": "watch", "id": ...}``), nothing else.
Every ``FAIRGATE_CONSOLE_RECHECK_S`` the socket re-reads its user (one query) and is closed once
they are gone (4401) or have lost a group they joined (4403).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from console import access, selectors
from console.live.groups import groups_for
from console.live.publisher import publisher_current
from console.live.snapshot import request_card
from gateway.api import current

if TYPE_CHECKING:
    from console.live.publisher import Publisher
    from tenants.models import Tenant

log = logging.getLogger(__name__)

REQUEST_ID_RE = re.compile(r"[A-Za-z0-9._:@+=~-]{1,128}")
UNAUTHENTICATED = 4401
ACCESS_LOST = 4403


def _scope_of(user, requested: str | None):
    tenant = access.queue_tenant(user, requested)
    return tenant, groups_for(user, tenant.pk if tenant else None)


class ConsoleConsumer(AsyncJsonWebsocketConsumer):
    tenant: Tenant | None = None
    watch_id: str | None = None  # set only with a tenant
    _card_text: str | None = None
    _charge: dict | None = None
    watching: Publisher | None = None  # the publisher told of this socket's tenant (told again when it closes)
    joined: list[str]
    recheck: asyncio.Task | None = None
    revoked = False  # closed by a re-check: nothing more is sent

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=UNAUTHENTICATED)
            return
        requested = parse_qs(self.scope.get("query_string", b"").decode("latin-1")).get("tenant", [None])[0]
        self.tenant, self.joined = await database_sync_to_async(_scope_of)(user, requested)
        for group in self.joined:
            await self.channel_layer.group_add(group, self.channel_name)
        publisher = publisher_current()
        if self.tenant is not None and publisher is not None:
            publisher.watch(self.tenant.pk)
            self.watching = publisher
        await self.accept()
        await self.send_json(
            {
                "type": "hello",
                "role": access.role_of(user),
                "groups": self.joined,
                "tenant": self.tenant.slug if self.tenant else None,
            }
        )
        await self._send_initial()
        session_key = getattr(self.scope.get("session"), "session_key", None)
        self.recheck = asyncio.create_task(self._recheck_every(user.pk, session_key))

    async def disconnect(self, code: int) -> None:
        if self.recheck is not None and self.recheck is not asyncio.current_task():
            self.recheck.cancel()
        self.recheck = None
        await self._leave()

    async def _leave(self) -> None:
        if self.watching is not None:
            assert self.tenant is not None  # told only of a tenant
            self.watching.unwatch(self.tenant.pk)
            self.watching = None
        joined, self.joined = getattr(self, "joined", []), []
        for group in joined:
            await self.channel_layer.group_discard(group, self.channel_name)

    # --- access re-checked while the socket is open ---------------------------------------

    async def _recheck_every(self, user_id: int, session_key: str | None) -> None:
        interval_s = float(settings.FAIRGATE_CONSOLE_RECHECK_S)
        while True:
            await asyncio.sleep(interval_s)
            try:
                user = await database_sync_to_async(access.console_user_current)(
                    user_id=user_id, session_key=session_key
                )
            except Exception:  # a database error or any other: the socket is checked again next time
                log.warning("console socket: could not re-check user %s; trying again later", user_id, exc_info=True)
                continue
            code = self._closing_code(user)
            if code is not None:
                await self._revoke(code)
                return

    def _closing_code(self, user) -> int | None:
        """4401 once the user is gone, 4403 once a group this socket joined is no longer theirs."""
        if user is None:
            return UNAUTHENTICATED
        tenant_id = self.tenant.pk if self.tenant is not None else None
        allowed = groups_for(
            user, tenant_id if tenant_id is not None and access.may_watch_tenant(user, tenant_id) else None
        )
        return ACCESS_LOST if set(self.joined) - set(allowed) else None

    async def _revoke(self, code: int) -> None:
        self.revoked = True
        await self._leave()
        reason = "signed_out" if code == UNAUTHENTICATED else "access_changed"
        await self.send_json({"type": "closed", "reason": reason})
        await self.close(code=code)

    async def _send_initial(self) -> None:
        publisher = publisher_current()
        if publisher is None:
            return
        d = current()
        if self.tenant is not None and d is not None:
            queue = publisher.queue_of(d, self.tenant.slug, d.now_ms())
            jobs = await publisher.jobs_now(d, self.tenant.pk, self.tenant.slug)
            await self.send_json({"type": "update", "queue": queue, "jobs": jobs})
        if access.is_admin(self.scope["user"]) and publisher.ops_text:
            await self.send(text_data=publisher.ops_text)

    # --- from the client -----------------------------------------------------------------

    async def receive_json(self, content, **kwargs) -> None:
        if self.revoked or not isinstance(content, dict) or content.get("type") != "watch":
            return  # nothing else is understood; nothing the client says changes its groups
        wanted = str(content.get("id") or "").strip()
        if not wanted:
            self.watch_id, self._card_text = None, None
            return
        if self.tenant is None or not REQUEST_ID_RE.fullmatch(wanted):
            await self.send_json({"type": "card", "id": wanted[:128], "found": False, "request": None})
            return
        self.watch_id, self._card_text, self._charge = wanted, None, None
        await self._send_card(force=True)

    async def _send_card(self, *, force: bool = False) -> None:
        assert self.tenant is not None and self.watch_id is not None  # a card is of a watched request
        card = request_card(current(), self.tenant.slug, self.watch_id)
        charge = self._charge
        if charge is None and (card is None or card.get("state") not in ("queued", "running")):
            charge = await database_sync_to_async(selectors.charge_of)(tenant=self.tenant, request_id=self.watch_id)
            self._charge = charge
        text = json.dumps(
            {
                "type": "card",
                "id": self.watch_id,
                "found": card is not None or charge is not None,
                "request": card,
                "charge": charge,
            },
            default=str,
        )
        if force or text != self._card_text:
            self._card_text = text
            await self.send(text_data=text)

    # --- from the publisher (group messages) ---------------------------------------------

    async def tenant_update(self, event: dict) -> None:
        if self.revoked:
            return
        await self.send(text_data=event["text"])
        if self.watch_id and "ids" in event and self.watch_id not in event["ids"]:
            await self._send_card()

    async def finance_update(self, event: dict) -> None:
        if self.revoked:
            return
        await self.send(text_data=event["text"])

    async def ops_update(self, event: dict) -> None:
        if self.revoked:
            return
        await self.send(text_data=event["text"])
