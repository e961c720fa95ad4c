"""The client's errors: one hierarchy, so a caller catches `TransportError` for "no usable response"."""

from __future__ import annotations


class TransportError(Exception):
    """The exchange failed below HTTP: no usable response came back."""


class ConnectError(TransportError):
    """The connection could not be opened (refused, unreachable, TLS failed)."""


class ReadError(TransportError):
    """The connection ended before the whole response arrived."""


class RemoteProtocolError(TransportError):
    """The server answered something that is not HTTP/1.1."""


class Timeout(TransportError):
    """A bounded wait ran out."""


class ConnectTimeout(Timeout):
    pass


class ReadTimeout(Timeout):
    pass


class PoolTimeout(Timeout):
    """Every connection the pool may open to this origin stayed busy for the connect timeout."""
