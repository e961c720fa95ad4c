"""Secrets and personal data kept out of the gateway's logs.

`redact_secrets` (rules.py) is the one helper: anything that writes text a client sent or a
model produced (log lines here, span attributes where tracing exists) passes it through. The
formatter applies it to every formatted line, tracebacks included, so an exception message that
quotes a prompt cannot leak a key either.
"""

from __future__ import annotations

import logging

from gateway.safety.rules import redact_secrets


class RedactingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact_secrets(super().format(record))


def install_redaction(logger: logging.Logger | None = None) -> None:
    """Every handler of `logger` (default: the root) redacts what it writes, keeping its format."""
    for handler in (logger or logging.getLogger()).handlers:
        current = handler.formatter or logging.Formatter()
        if not isinstance(current, RedactingFormatter):
            redacting = RedactingFormatter(current._fmt, current.datefmt)
            redacting._style = current._style
            handler.setFormatter(redacting)
