"""Route reasons built from directory data (Consul meta, regions files) become header values."""

from gateway.call.context import header_safe


def test_route_reason_with_control_characters_stays_one_header_line() -> None:
    assert header_safe("node=eu-1\r\nx-injected: yes\x00") == "node=eu-1  x-injected: yes "


def test_route_reason_is_ascii_and_bounded() -> None:
    value = header_safe("région=" + "x" * 1000)
    assert value.isascii() and len(value) == 512
