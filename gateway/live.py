"""The gateway's seam to whoever shows it live (the console, which registers itself when Django
starts: console.apps): billing events that have committed, and the serving loop's start.

The gateway imports nothing of the console; with no console installed both calls do nothing.
"""

from __future__ import annotations

from collections.abc import Callable

Events = list[dict]  # [{"kind": "charges"|"alerts", "tenant_id", "row"}, ...]

_publish: list[Callable[[Events], None]] = []
_on_serving: list[Callable[[], None]] = []


def register(*, publish: Callable[[Events], None], on_serving: Callable[[], None]) -> None:
    """Called once per process (an AppConfig.ready); registering the same callables again is a no-op."""
    if publish not in _publish:
        _publish.append(publish)
    if on_serving not in _on_serving:
        _on_serving.append(on_serving)


def publish_on_commit(events: Events) -> None:
    """Events of a booking that has committed (the billing worker's answer): to the live views."""
    for publish in _publish:
        publish(events)


def serving() -> None:
    """The serving process's event loop runs, beside its dispatcher: live updates may start."""
    for start in _on_serving:
        start()
