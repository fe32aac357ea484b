"""ASGI middleware for the console, admin and WebSockets behind a TLS-terminating proxy.

From a peer in ``FAIRGATE_TRUSTED_PROXIES`` the scope's scheme is taken from ``X-Forwarded-Proto``
(so Django's ``is_secure()``, CSRF and HSTS see the client's https) and its client address from
``X-Forwarded-For`` (read as `gateway.clientip` reads it for the API). From any other peer both
headers are ignored. The API paths read the client address through `gateway.clientip` themselves.
"""

from __future__ import annotations

from gateway.clientip import client_ip, proxy_trusted

SCHEMES = {"http": {"http": "http", "https": "https"}, "websocket": {"http": "ws", "https": "wss"}}


def forwarded_scope(scope: dict) -> dict:
    """``scope`` with the trusted proxy's view of the client, or ``scope`` itself."""
    client = scope.get("client")
    peer = client[0] if client else None
    if scope["type"] not in SCHEMES or not proxy_trusted(peer):
        return scope
    proto = forwarded_for = None
    for name, value in scope.get("headers", ()):
        if name == b"x-forwarded-proto":
            proto = value.decode("latin-1").rsplit(",", 1)[-1].strip().lower()  # the nearest proxy's word
        elif name == b"x-forwarded-for":
            forwarded_for = value.decode("latin-1")
    changed = dict(scope)
    scheme = SCHEMES[scope["type"]].get(proto or "")
    if scheme:
        changed["scheme"] = scheme
    address = client_ip(peer, forwarded_for)
    if address and address != peer:
        changed["client"] = (address, 0)
    return changed


class ForwardedHeaders:
    """Wraps an ASGI app: each HTTP or WebSocket scope as `forwarded_scope` makes it."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        await self.app(forwarded_scope(scope), receive, send)
