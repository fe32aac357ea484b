"""The gateway's seam to whoever shows it live (the console, which registers itself when Django
starts: console.apps): the serving loop's start. (What billing booked reaches the console as
billing's own news, billing.news, announced by gateway.charging in this process.)

The gateway imports nothing of the console; with no console installed this does nothing.
"""

from __future__ import annotations

from collections.abc import Callable

_on_serving: list[Callable[[], object]] = []  # what a callable returns is not used


def register(*, on_serving: Callable[[], object]) -> None:
    """Called once per process (an AppConfig.ready); registering the same callable again is a no-op."""
    if on_serving not in _on_serving:
        _on_serving.append(on_serving)


def serving() -> None:
    """The serving process's event loop runs, beside its dispatcher: live updates may start."""
    for start in _on_serving:
        start()
