"""An open console socket re-checks its user every ``FAIRGATE_CONSOLE_RECHECK_S`` (made small
here) and is closed once the user is gone (4401: deactivated, deleted, signed out, password
changed) or has lost a group the socket joined (4403: moved off the tenant, demoted from finance
or admin). A socket whose user is unchanged stays open and keeps receiving its group messages."""

from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer

from console import access
from console.live.groups import FINANCE_GROUP, tenant_group
from tenants.models import User
from tests.integration.console.conftest import A, B, persona
from tests.integration.console.test_consumers import connected, keep_the_test_connection, run  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.django_db

BOUND_S = 10.0  # a safety bound only: each wait ends when the close (or the re-check) arrives


@pytest.fixture(autouse=True)
def quick_recheck(settings):
    settings.FAIRGATE_CONSOLE_RECHECK_S = 0.05


async def close_of(ws) -> tuple[int, list[dict]]:
    """Read until the server closes the socket: its close code and the messages before it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + BOUND_S
    seen = []
    while True:
        out = await ws.receive_output(timeout=max(0.01, deadline - loop.time()))
        if out["type"] == "websocket.close":
            return out.get("code"), seen
        seen.append(json.loads(out["text"]))


def _update(user: User, **fields) -> None:
    User.objects.filter(pk=user.pk).update(**fields)


def _set_password(user: User) -> None:
    user.set_password("changed")
    user.save(update_fields=["password"])


MEMBER_CHANGES = {
    "deactivated": (lambda p, w: _update(p.user, is_active=False), 4401),
    "deleted": (lambda p, w: User.objects.filter(pk=p.user.pk).delete(), 4401),
    "signed out": (lambda p, w: p.client.logout(), 4401),
    "password changed": (lambda p, w: _set_password(p.user), 4401),
    "removed from the tenant": (lambda p, w: _update(p.user, tenant=None), 4403),
    "moved to another tenant": (lambda p, w: _update(p.user, tenant=w[B]), 4403),
}


@pytest.mark.parametrize("change", list(MEMBER_CHANGES))
def test_a_member_who_loses_access_is_closed(world, change):
    ann = persona("ann", role="member", tenant=world[A])
    apply, expected = MEMBER_CHANGES[change]

    async def scenario():
        ws, hello = await connected(ann)
        assert hello["groups"] == [tenant_group(world[A].pk)]
        await sync_to_async(apply)(ann, world)
        code, seen = await close_of(ws)
        assert code == expected and seen[-1]["type"] == "closed"
        await ws.disconnect()

    run(scenario)


STAFF_CHANGES = {
    "finance demoted to member": ("finance", None, {"role": "member"}, 4403),
    "finance deactivated": ("finance", None, {"is_active": False}, 4401),
    "admin demoted to finance": ("admin", B, {"role": "finance"}, 4403),
}


@pytest.mark.parametrize("change", list(STAFF_CHANGES))
def test_staff_who_lose_their_role_are_closed(world, change):
    role, own, fields, expected = STAFF_CHANGES[change]
    fay = persona("fay", role=role, tenant=world[own] if own else None)

    async def scenario():
        ws, hello = await connected(fay, "/ws/console/?tenant=support")
        assert FINANCE_GROUP in hello["groups"]
        await sync_to_async(_update)(fay.user, **fields)
        code, _ = await close_of(ws)
        assert code == expected
        await ws.disconnect()

    run(scenario)


def test_an_unchanged_user_stays_open_through_rechecks(world, monkeypatch):
    ann = persona("ann", role="member", tenant=world[A])
    tom = persona("tom", role="member", tenant=world[A])
    checks: list[int] = []
    real = access.console_user_current

    def counted(*, user_id, session_key):
        checks.append(user_id)
        return real(user_id=user_id, session_key=session_key)

    monkeypatch.setattr(access, "console_user_current", counted)

    async def scenario():
        loop = asyncio.get_running_loop()
        a, _ = await connected(ann)
        t, _ = await connected(tom)
        await sync_to_async(_update)(ann.user, is_active=False)
        assert (await close_of(a))[0] == 4401
        seen_before = checks.count(tom.user.pk)
        deadline = loop.time() + BOUND_S
        while checks.count(tom.user.pk) < seen_before + 2:  # two more re-checks of tom since ann's close
            assert loop.time() < deadline, "the socket was not re-checked"
            await asyncio.sleep(0.01)
        text = json.dumps({"type": "update", "queue": {"rows": [{"id": "still-here"}]}})
        await get_channel_layer().group_send(
            tenant_group(world[A].pk), {"type": "tenant.update", "text": text, "ids": ["still-here"]}
        )
        while (message := await t.receive_json_from(timeout=BOUND_S))["type"] != "update":
            pass  # the initial queue view, if a dispatcher runs
        assert message["queue"]["rows"][0]["id"] == "still-here"
        for ws in (a, t):
            await ws.disconnect()

    run(scenario)


def test_a_recheck_is_one_query(world):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    ann = persona("ann", role="member", tenant=world[A])
    session_key = ann.client.session.session_key
    with CaptureQueriesContext(connection) as queries:
        assert access.console_user_current(user_id=ann.user.pk, session_key=session_key) == ann.user
    assert len(queries.captured_queries) == 1
    assert access.console_user_current(user_id=ann.user.pk, session_key="not-a-session") is None
