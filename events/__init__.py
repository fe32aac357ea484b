"""Live events: what the house tells its watchers (the console) once a transaction has committed.

Publishers (billing, the gateway, any app) call `publish_on_commit`; subscribers (console.live)
`subscribe`. The bottom of the layers: it imports no app, so every app may publish.
"""

from events.bus import (
    Committed,
    Event,
    publish_all_on_commit,
    publish_on_commit,
    relay,
    relayed,
    send,
    subscribe,
    unsubscribe,
)

__all__ = [
    "Committed",
    "Event",
    "publish_all_on_commit",
    "publish_on_commit",
    "relay",
    "relayed",
    "send",
    "subscribe",
    "unsubscribe",
]
