"""A socket transport for driving `manage.py serve`'s protocol (HeaderTimeoutProtocol) in process:
it records each write, whether reading is paused, and the close, which it passes to the protocol as
a lost connection. A write after the close fails the test."""

from __future__ import annotations

import asyncio


class FakeTransport(asyncio.Transport):
    def __init__(self, peer: str = "192.0.2.9") -> None:
        super().__init__()
        self.peer = peer
        self.writes: list[bytes] = []
        self.paused = False
        self.closed = False
        self.protocol: asyncio.Protocol | None = None

    @property
    def written(self) -> bytes:
        return b"".join(self.writes)

    def get_extra_info(self, name, default=None):
        return {"peername": (self.peer, 40000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def get_protocol(self):
        return self.protocol

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def is_closing(self) -> bool:
        return self.closed

    def write(self, data) -> None:
        assert not self.closed, "written after close"
        self.writes.append(bytes(data))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            assert self.protocol is not None
            self.protocol.connection_lost(None)

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        pass
