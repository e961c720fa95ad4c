"""One write per loop turn (http_server/cork.py): the same bytes, in order, never lost at close."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from http_server.cork import CorkedTransport


class _Recording(asyncio.Transport):
    """A transport that keeps what it was given to write, as a socket's send() calls would."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False
        self.eof = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.closed and not self.eof, "written after close/write_eof"
        self.writes.append(bytes(data))

    def write_eof(self) -> None:
        self.eof = True

    def can_write_eof(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0


# A turn: the writes the app makes before the loop runs again; the last turn may end with a close.
turns = st.lists(st.lists(st.binary(max_size=40), max_size=6), min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(turns, st.sampled_from(["open", "close", "write_eof"]))
def test_each_turn_leaves_in_one_write_with_every_byte_in_order(
    written: list[list[bytes]], ending: str
) -> None:
    async def run() -> _Recording:
        real = _Recording()
        corked = CorkedTransport(real, asyncio.get_running_loop())
        for i, turn in enumerate(written):
            before = len(real.writes)
            for data in turn:
                corked.write(data)
            if i == len(written) - 1 and ending != "open":
                getattr(corked, ending)()  # sends what this turn held first
            else:
                await asyncio.sleep(0)  # the turn ends
            assert len(real.writes) - before <= 1
        return real

    real = asyncio.run(run())
    assert b"".join(real.writes) == b"".join(b"".join(turn) for turn in written)


def test_other_attributes_are_the_real_transports() -> None:
    async def run() -> None:
        real = _Recording()
        corked = CorkedTransport(real, asyncio.get_running_loop())
        corked.write(b"held")
        assert corked.get_write_buffer_size() == 4  # what is held counts as buffered
        assert corked.can_write_eof() and not corked.is_closing()
        await asyncio.sleep(0)
        assert real.writes == [b"held"] and corked.get_write_buffer_size() == 0

    asyncio.run(run())
