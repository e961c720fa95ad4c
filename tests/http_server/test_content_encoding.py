"""Compressed request bodies (`Content-Encoding`), read by `read_body` for the gateway and every
node: whatever the codings (gzip, deflate, several in a row, any case and spacing) and however the
body arrives in pieces, the app gets exactly the bytes that were encoded; a body that decodes past
the size limit is a 413 however small it came (a bomb is never inflated whole); a coding that does
not decode is a 400; an unknown coding is a 415 naming the accepted ones before any byte is read."""

from __future__ import annotations

import asyncio
import gzip
import os
import zlib
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from http_server import ServerLimits, read_body
from protocol.errors import InvalidRequestError, PayloadTooLargeError, UnsupportedMediaTypeError

LIMIT = 4096
LIMITS = ServerLimits(max_body_bytes=LIMIT)
ENCODE = {"gzip": gzip.compress, "x-gzip": gzip.compress, "deflate": zlib.compress, "identity": bytes}


class Receive:
    """The ASGI receive channel of a request whose body arrives in `pieces`."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces, self.calls = pieces, 0

    async def __call__(self) -> dict[str, Any]:
        self.calls += 1
        index = self.calls - 1
        return {"type": "http.request", "body": self.pieces[index], "more_body": index < len(self.pieces) - 1}


def read(
    encoded: bytes, coding_header: str, cuts: list[int] | None = None, limits: ServerLimits = LIMITS
) -> bytes:
    points = sorted(cuts or [])
    edges = [0, *points, len(encoded)]
    pieces = [encoded[a:b] for a, b in pairwise(edges)]
    return asyncio.run(read_body(Receive(pieces), {"content-encoding": coding_header}, limits))


def encoded(body: bytes, codings: list[str]) -> bytes:
    for name in codings:
        body = ENCODE[name](body)
    return body


CODINGS = st.lists(st.sampled_from(list(ENCODE)), min_size=1, max_size=3)


@settings(max_examples=200, deadline=None)
@given(
    body=st.binary(max_size=LIMIT),
    codings=CODINGS,
    cuts=st.lists(st.integers(0, 64), max_size=4),
    shouting=st.booleans(),
    spaced=st.booleans(),
)
def test_any_coded_body_reads_as_the_bytes_that_were_coded(
    body: bytes, codings: list[str], cuts: list[int], shouting: bool, spaced: bool
) -> None:
    header = (", " if spaced else ",").join(name.upper() if shouting else name for name in codings)
    data = encoded(body, codings)
    assert read(data, header, [min(c, len(data)) for c in cuts]) == body


def test_several_gzip_members_read_as_one_body() -> None:
    assert read(gzip.compress(b'{"a": ') + gzip.compress(b"1}"), "gzip") == b'{"a": 1}'


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
@pytest.mark.parametrize("size", [LIMIT + 1, 3 * 1024 * 1024])
def test_a_body_that_decodes_past_the_limit_is_a_413_however_small_it_came(coding: str, size: int) -> None:
    data = ENCODE[coding](bytes(size))
    assert len(data) < LIMIT  # a bomb: tiny on the wire
    with pytest.raises(PayloadTooLargeError, match="decodes to more than"):
        read(data, coding)


def test_a_body_of_exactly_the_limit_is_read() -> None:
    assert read(gzip.compress(b"a" * LIMIT), "gzip") == b"a" * LIMIT


def test_a_large_coded_body_is_read_whole() -> None:
    """Over 64 KiB on the wire, it is inflated off the event loop: the same bytes come back."""
    body = os.urandom(300 * 1024)  # incompressible: as large coded as plain
    limits = ServerLimits(max_body_bytes=1024 * 1024)
    assert read(gzip.compress(body), "gzip", [1000, 70_000], limits) == body
    with pytest.raises(PayloadTooLargeError):
        read(gzip.compress(body * 4), "gzip", limits=limits)


@settings(max_examples=100, deadline=None)
@given(body=st.binary(min_size=1, max_size=512), coding=st.sampled_from(["gzip", "deflate"]), data=st.data())
def test_a_cut_or_corrupted_coding_is_a_400(body: bytes, coding: str, data: st.DataObject) -> None:
    whole = ENCODE[coding](body)
    cut = whole[: data.draw(st.integers(0, len(whole) - 1), label="cut")]
    with pytest.raises(InvalidRequestError):
        read(cut, coding)
    with pytest.raises(InvalidRequestError):
        read(whole + b"trailing", "deflate" if coding == "deflate" else "gzip")


def test_plain_bytes_labelled_gzip_are_a_400_not_garbage() -> None:
    with pytest.raises(InvalidRequestError, match="not valid gzip data"):
        read(b'{"model": "x"}', "gzip")


@pytest.mark.parametrize("header", ["br", "zstd", "compress", "gzip, br"])
def test_an_unknown_coding_is_a_415_naming_the_accepted_ones_before_the_body_is_read(header: str) -> None:
    receive = Receive([b"whatever"])
    with pytest.raises(UnsupportedMediaTypeError) as refused:
        asyncio.run(read_body(receive, {"content-encoding": header}, LIMITS))
    assert refused.value.status_code == 415 and receive.calls == 0
    assert refused.value.headers == {"accept-encoding": "gzip, deflate"}


def test_identity_alone_is_no_coding() -> None:
    assert read(b"plain", "identity") == b"plain"
