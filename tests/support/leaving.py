"""A client that leaves: how the departure tests end a raw-socket request."""

from __future__ import annotations

import socket
import struct


def leave(client: socket.socket, *, read: int = 0, reset: bool = False) -> None:
    """Read up to `read` bytes of what has arrived (never waiting long for more), then close: with
    a FIN, or with an RST when `reset` (the client's process died)."""
    if read:
        client.settimeout(0.2)
        try:
            for _ in range(read):
                if not client.recv(1):
                    break
        except TimeoutError:
            pass
    if reset:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()
