"""The console WebSocket through the real ASGI application: session auth, origin check, groups
per tenant and role, and isolation whatever the client sends. Scenarios are driven with
``async_to_sync`` from the test's thread, so the consumer's database calls run in the test's
transaction (on SQLite a transactional test could not flush the append-only ledger)."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.db import transaction

from billing.services import budget_hold, charge_settle
from console.live.groups import ADMIN_GROUP, FINANCE_GROUP, tenant_group
from tests.integration.console.conftest import A, B, persona

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def keep_the_test_connection(monkeypatch):
    """Channels closes "old" connections around every database call; here those calls run on
    the test's own connection, inside its transaction, which must stay open."""
    monkeypatch.setattr("channels.db.close_old_connections", lambda: None)  # also what aclose_… calls


ORIGIN = (b"origin", b"http://127.0.0.1:8000")


def _cookie(p) -> tuple[bytes, bytes]:
    return b"cookie", f"sessionid={p.client.cookies['sessionid'].value}".encode()


def communicator(p=None, *, path: str = "/ws/console/", origin=ORIGIN) -> WebsocketCommunicator:
    from config.asgi import application

    headers = [h for h in (origin, _cookie(p) if p else None) if h]
    return WebsocketCommunicator(application, path, headers=headers)


async def connected(p, path: str = "/ws/console/") -> tuple[WebsocketCommunicator, dict]:
    ws = communicator(p, path=path)
    ok, _ = await ws.connect()
    assert ok
    return ws, await ws.receive_json_from(timeout=2)


async def nothing_for(ws: WebsocketCommunicator, timeout: float = 0.3) -> bool:
    return await ws.receive_nothing(timeout=timeout)


def run(scenario):
    """Drive a scenario from this (the test's) thread: the consumer's database calls then run
    back on it, inside the test's transaction (no transactional flush needed)."""
    return async_to_sync(scenario)()


def test_anonymous_socket_is_closed(world):
    async def scenario():
        ws = communicator(None)
        ok, code = await ws.connect()
        assert not ok or (await ws.receive_output(timeout=1))["type"] == "websocket.close"
        await ws.disconnect()

    run(scenario)


def test_foreign_origin_is_refused(world):
    ann = persona("ann", role="member", tenant=world[A])

    async def scenario():
        for origin in ((b"origin", b"http://evil.example"), None):
            ws = communicator(ann, origin=origin)
            ok, _ = await ws.connect()
            assert not ok
            await ws.disconnect()

    run(scenario)


def test_groups_follow_the_role_and_ignore_what_a_member_asks_for(world):
    ann = persona("ann", role="member", tenant=world[A])
    bob = persona("bob", role="member", tenant=world[B])
    fay = persona("fay", role="finance", tenant=None)
    ada = persona("ada", role="admin", tenant=world[B])

    async def scenario():
        ws, hello = await connected(bob, "/ws/console/?tenant=support")
        assert hello["tenant"] == B and hello["groups"] == [tenant_group(world[B].pk)]
        await ws.disconnect()
        ws, hello = await connected(ann)
        assert hello["groups"] == [tenant_group(world[A].pk)]
        await ws.disconnect()
        ws, hello = await connected(fay)
        assert hello["groups"] == [FINANCE_GROUP]
        await ws.disconnect()
        ws, hello = await connected(ada, "/ws/console/?tenant=support")
        assert hello["groups"] == [tenant_group(world[A].pk), FINANCE_GROUP, ADMIN_GROUP]
        await ws.disconnect()

    run(scenario)


def test_tenant_messages_reach_that_tenant_only(world):
    ann = persona("ann", role="member", tenant=world[A])
    tom = persona("tom", role="member", tenant=world[A])
    bob = persona("bob", role="member", tenant=world[B])

    async def scenario():
        layer = get_channel_layer()
        a1, _ = await connected(ann)
        a2, _ = await connected(tom)
        b1, _ = await connected(bob)
        await b1.send_json_to({"type": "join", "group": tenant_group(world[A].pk)})  # ignored
        await b1.send_json_to({"type": "watch", "id": "req-a-secret-1"})
        card = await b1.receive_json_from(timeout=2)
        assert card["type"] == "card" and card["found"] is False and card["charge"] is None
        text = json.dumps({"type": "update", "queue": {"rows": [{"id": "only-for-a"}]}})
        await layer.group_send(
            tenant_group(world[A].pk), {"type": "tenant.update", "text": text, "ids": ["only-for-a"]}
        )
        assert (await a1.receive_json_from(timeout=2))["queue"]["rows"][0]["id"] == "only-for-a"
        assert (await a2.receive_json_from(timeout=2))["queue"]["rows"][0]["id"] == "only-for-a"
        assert await nothing_for(b1)
        for ws in (a1, a2, b1):
            await ws.disconnect()

    run(scenario)


def test_watch_shows_own_settled_request_with_its_charge(world):
    ann = persona("ann", role="member", tenant=world[A])

    async def scenario():
        ws, _ = await connected(ann)
        await ws.send_json_to({"type": "watch", "id": "req-a-secret-1"})
        card = await ws.receive_json_from(timeout=2)
        assert card["found"] and card["charge"]["request_id"] == "req-a-secret-1"
        await ws.send_json_to({"type": "watch", "id": "bad id with spaces"})
        assert (await ws.receive_json_from(timeout=2))["found"] is False
        await ws.disconnect()

    run(scenario)


def _settle(slug: str, request_id: str, *, rollback: bool = False) -> None:
    class Rollback(Exception):
        pass

    try:
        with transaction.atomic():
            budget_hold(
                tenant_slug=slug,
                request_id=request_id,
                class_name="BATCH",
                model="sim-llama",
                prompt_tokens=10,
                max_output_tokens=10,
            )
            charge_settle(request_id=request_id, backend_name="sim-gpu", prompt_tokens=10, completion_tokens=5)
            if rollback:
                raise Rollback
    except Rollback:
        pass


def _settle_and_commit(capture, slug: str, request_id: str) -> None:
    """The test's own transaction never commits: run the on-commit callbacks as a commit would."""
    with capture(execute=True):
        _settle(slug, request_id)


def test_charges_are_pushed_after_commit_to_their_tenant_and_finance_only(world, django_capture_on_commit_callbacks):
    ann = persona("ann", role="member", tenant=world[A])
    bob = persona("bob", role="member", tenant=world[B])
    fay = persona("fay", role="finance", tenant=None)

    async def scenario():
        a, _ = await connected(ann)
        b, _ = await connected(bob)
        f, _ = await connected(fay)
        await sync_to_async(_settle)(A, "rolled-back", rollback=True)
        assert await nothing_for(a) and await nothing_for(f)  # a rolled-back charge is never shown
        await sync_to_async(_settle)(A, "not-yet")
        assert await nothing_for(a)  # written, not committed yet: nothing
        await sync_to_async(_settle_and_commit)(django_capture_on_commit_callbacks, A, "pushed-1")
        update = await a.receive_json_from(timeout=2)
        assert update["type"] == "update" and update["charges"][0]["request_id"] == "pushed-1"
        assert (await f.receive_json_from(timeout=2))["type"] == "finance"
        assert await nothing_for(b)
        for ws in (a, b, f):
            await ws.disconnect()

    run(scenario)
