"""Key presses in SIP INFO bodies: `application/dtmf-relay` (`Signal=5` and `Duration=160` lines, what JsSIP and
SIP.js send) and `application/dtmf` (the digit alone). Pure."""

from __future__ import annotations

DIGITS = frozenset("0123456789*#ABCD")
CONTENT_TYPES = ("application/dtmf-relay", "application/dtmf")
# Some phones put the RFC 4733 event numbers in dtmf-relay's Signal instead of the characters for these.
EVENT_NUMBERS = {"10": "*", "11": "#", "12": "A", "13": "B", "14": "C", "15": "D"}


class BadDtmf(ValueError):
    """An INFO body of a DTMF type that names no key; the message says why (sent back with 400)."""


def media_type(content_type: str | None) -> str:
    """`Application/DTMF-Relay; charset=x` -> `application/dtmf-relay`."""
    return (content_type or "").partition(";")[0].strip().lower()


def info_digit(content_type: str | None, body: str) -> str:
    """The key an INFO body of one of `CONTENT_TYPES` presses; raises `BadDtmf`."""
    kind = media_type(content_type)
    if kind == "application/dtmf-relay":
        fields = {}
        for line in body.splitlines():
            name, eq, value = line.partition("=")
            if eq:
                fields[name.strip().lower()] = value.strip()
        signal = fields.get("signal")
        if signal is None:
            raise BadDtmf("dtmf-relay body has no Signal line")
        signal = EVENT_NUMBERS.get(signal, signal)
    elif kind == "application/dtmf":
        signal = body.strip()
    else:
        raise BadDtmf(f"not a DTMF content type: {kind[:40]!r}")
    digit = signal.upper()
    if digit not in DIGITS:
        raise BadDtmf(f"not a DTMF key: {signal[:20]!r}")
    return digit
