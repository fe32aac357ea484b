"""The billing worker's pipe protocol, shared by its two ends (billing.client.pipe in the
gateway, billing.worker_loop in the worker): one pickled message each way per batch, framed as
``Connection.send_bytes`` frames them (a 4-byte big-endian signed length and the payload; -1,
then an 8-byte unsigned length, past 2 GiB). The worker sends `READY` once Django is set up,
then `book_batch`'s answer for each batch; a batch of None (`STOP`) is a clean stop. Imported
by the spawned worker before Django is set up: nothing here needs it.
"""

from __future__ import annotations

import pickle
import struct
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:  # for the types only: nothing here imports Django at module level (see above)
    from billing.pricing import UnitPrices

READY = b"ready"
STOP = pickle.dumps(None, pickle.HIGHEST_PROTOCOL)
_SIZE = struct.Struct("!i")  # Connection.send_bytes' frame header
_LONG_SIZE = struct.Struct("!Q")  # after a size of -1
_LONG_MARK = -1
# `book_batch`'s answer (billing.worker_loop): a result per ask (billing.booking.book's, as `_crossing` sends them), the
# committed live events (events.relayed), and the prices ({backend name: UnitPrices}) if they
# changed since the last answer.
BatchAnswer: TypeAlias = "tuple[list[object], dict[tuple[int, str], bytes], dict[str, UnitPrices] | None]"


def frame_header(size: int) -> bytes:
    """The frame header ``Connection.recv_bytes`` expects before ``size`` bytes of payload."""
    if size <= 0x7FFFFFFF:
        return _SIZE.pack(size)
    return _SIZE.pack(_LONG_MARK) + _LONG_SIZE.pack(size)


class Frames:
    """The bytes read from the worker so far, cut into the messages ``send_bytes`` framed."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data

    @property
    def partial(self) -> bool:
        """True while part of a message is still to come."""
        return bool(self._buffer)

    def whole(self) -> list[bytes]:
        """The messages complete now, in order (taken out of the buffer)."""
        messages = []
        while (message := self._pop()) is not None:
            messages.append(message)
        return messages

    def _pop(self) -> bytes | None:
        buffer = self._buffer
        if len(buffer) < _SIZE.size:
            return None
        (size,), start = _SIZE.unpack_from(buffer), _SIZE.size
        if size == _LONG_MARK:
            if len(buffer) < start + _LONG_SIZE.size:
                return None
            (size,), start = _LONG_SIZE.unpack_from(buffer, start), start + _LONG_SIZE.size
        elif size < 0:
            raise ValueError(f"a corrupt frame header (size {size})")
        end = start + size
        if len(buffer) < end:
            return None
        with memoryview(buffer) as view:
            message = bytes(view[start:end])
        del buffer[:end]
        return message
