"""The console's live socket on the configured (Redis) channel layer survives an idle spell.

redis-py 8 gives every connection a 5 s socket timeout; channels_redis waits for a consumer's
next message in a BZPOPMIN of up to 5 s, so with that default an idle consumer's read timed out
(``redis.exceptions.TimeoutError``) and Channels closed its WebSocket 5-7 s after it connected.
Here a socket idles for longer than that, twice over, and a group message sent afterwards must
still arrive.
"""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal

import pytest
from channels.layers import get_channel_layer

from console.live.groups import tenant_group
from tenants.models import Tenant
from tests.integration.console.conftest import persona
from tests.integration.console.test_consumers import connected, keep_the_test_connection, run  # noqa: F401  (autouse fixture)

pytestmark = [pytest.mark.redis, pytest.mark.django_db]

IDLE_S = 11.0  # longer than redis-py's 5 s default socket timeout plus a 5 s blocking pop


def test_an_idle_console_socket_still_receives_its_group_messages():
    tenant = Tenant.objects.create(slug="idle", name="Idle", quota_share=Decimal("0.5"))
    ann = persona("ann", role="member", tenant=tenant)

    async def scenario():
        layer = get_channel_layer()
        assert type(layer).__module__.startswith("channels_redis"), "the configured layer is not Redis"
        ws, _ = await connected(ann)
        await asyncio.sleep(IDLE_S)
        text = json.dumps({"type": "update", "queue": {"rows": [{"id": "after-idle"}]}})
        await layer.group_send(tenant_group(tenant.pk), {"type": "tenant.update", "text": text, "ids": ["after-idle"]})
        update = await ws.receive_json_from(timeout=5)  # raises the consumer's error if it died meanwhile
        assert update["queue"]["rows"][0]["id"] == "after-idle"
        await ws.disconnect()

    run(scenario)
