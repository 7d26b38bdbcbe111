"""Per-connection limits on the call links: concurrent connections per client address, and messages per second.

`ClientSlots` counts the live connections of each client address across every link (the WebSocket gateway, WebRTC
peers, AudioSocket, which runs on its own event loop: hence the lock); `MessageRate` is one connection's token
bucket. Over either, the connection is closed with a reason that says which limit it hit (the frame size bound is
the serializers' `max_frame_bytes`). Pure bookkeeping: no I/O; the clock is passed in.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

BURST_S = 2.0  # a connection may send this many seconds' worth of messages at once (a network stall's backlog)
# uvicorn's `ws_max_size`: a frame up to this many times `calls.max_frame_bytes` reaches the serializer, which
# refuses it with its own reason ("oversize: N bytes > M") and a log line; the WebSocket layer refuses a bigger one
# before it is buffered whole (also 1009, with its own reason and no line of ours).
WS_MAX_SIZE_FACTOR = 4


def ws_max_size(max_frame_bytes: int) -> int:
    return WS_MAX_SIZE_FACTOR * max_frame_bytes


class TooManyConnections(Exception):
    """The client address already holds its `calls.max_connections_per_client` connections."""

    def __init__(self, address: str, limit: int) -> None:
        self.address, self.limit = address, limit
        super().__init__(f"too many connections from {address} (calls.max_connections_per_client = {limit})")


class ClientSlots:
    """Live connections per client address; `limit` 0 counts them but refuses none."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: Counter[str] = Counter()
        self._lock = threading.Lock()

    def held(self, address: str | None = None) -> int:
        """The slots `address` holds (every address's, without one)."""
        with self._lock:
            return self._held[address] if address is not None else sum(self._held.values())

    def acquire(self, address: str) -> None:
        """Take a slot for `address`; raises `TooManyConnections` when it has none left."""
        with self._lock:
            if self.limit and self._held[address] >= self.limit:
                raise TooManyConnections(address, self.limit)
            self._held[address] += 1

    def release(self, address: str) -> None:
        with self._lock:
            self._held[address] -= 1
            if self._held[address] <= 0:
                del self._held[address]

    @contextmanager
    def slot(self, address: str) -> Iterator[None]:
        """A slot for the block's duration (raises `TooManyConnections` before the block runs)."""
        self.acquire(address)
        try:
            yield
        finally:
            self.release(address)


def client_address(client) -> str:
    """The address a connection's limits count under (uvicorn puts a trusted proxy's X-Forwarded-For here)."""
    return getattr(client, "host", None) or "unknown"


class MessageRate:
    """A token bucket: `per_s` messages a second on average, bursts of `BURST_S` seconds' worth; `per_s` 0 is off."""

    def __init__(self, per_s: int, now: float) -> None:
        self.per_s = per_s
        self.capacity = max(1.0, per_s * BURST_S)
        self._tokens = self.capacity
        self._at = now

    def allow(self, now: float) -> bool:
        """Count one message at `now`; False when the connection is over its rate."""
        if not self.per_s:
            return True
        self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.per_s)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True
