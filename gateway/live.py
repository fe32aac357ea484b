"""The gateway's seam to the apps above it that work beside a serving process (the console's live
pushes, the Batch API's feeder; each registers itself when Django starts, in its AppConfig.ready):
the serving loop's start, and its stop. (Live events take their own path: events.publish_on_commit.)

The gateway imports nothing of those apps; with none installed this does nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

_on_serving: list[Callable[[], object]] = []  # what a callable returns is not used
_on_stopping: list[Callable[[], Awaitable[None]]] = []


def register(
    *, on_serving: Callable[[], object] | None = None, on_stopping: Callable[[], Awaitable[None]] | None = None
) -> None:
    """Called once per process (an AppConfig.ready); registering the same callable again is a no-op."""
    if on_serving is not None and on_serving not in _on_serving:
        _on_serving.append(on_serving)
    if on_stopping is not None and on_stopping not in _on_stopping:
        _on_stopping.append(on_stopping)


def serving() -> None:
    """The serving process's event loop runs, beside its dispatcher: live updates may start."""
    for start in _on_serving:
        start()


async def stopping() -> None:
    """The serving process stops: before its dispatcher does."""
    for stop in _on_stopping:
        await stop()
