"""The client's address: the socket peer, or `X-Forwarded-For` when the peer is a trusted proxy.

The ASGI server's own proxy-header handling is off (`serve` passes proxy_headers=False), so a
client cannot claim another address unless it connects through a proxy listed in
``FAIRGATE_TRUSTED_PROXIES``. The forwarded chain is read right to left, skipping trusted
proxies; the first untrusted hop is the client.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache

from django.conf import settings

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@lru_cache(maxsize=8)
def _networks(cidrs: tuple[str, ...]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(c.strip(), strict=False) for c in cidrs if c.strip())


def _trusted(address: str, networks: tuple[Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip())
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in net for net in networks if ip.version == net.version)


def proxy_trusted(peer: str | None) -> bool:
    """Whether ``peer`` (the socket's address) is one of FAIRGATE_TRUSTED_PROXIES."""
    networks = _networks(tuple(settings.FAIRGATE_TRUSTED_PROXIES))
    return bool(peer and networks and _trusted(peer, networks))


def client_ip(peer: str | None, forwarded_for: str | None) -> str | None:
    networks = _networks(tuple(settings.FAIRGATE_TRUSTED_PROXIES))
    if not peer or not forwarded_for or not networks or not _trusted(peer, networks):
        return peer or None
    hops = [h.strip() for h in forwarded_for.split(",") if h.strip()]
    for hop in reversed(hops):
        if not _trusted(hop, networks):
            return hop
    return hops[0] if hops else peer
