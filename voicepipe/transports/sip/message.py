"""SIP messages (RFC 3261 sections 7, 20 and 25), as one WebSocket message carries them (RFC 7118): parsing
text into a `Request` or a `Response`, reading the header fields a user agent needs (addresses, URIs, Via,
CSeq), building the response to a request, and writing any message back as text. Pure: no I/O, no clock.

`parse` raises only `SipError`, which carries the status a server answers with (400, 413 or 513, 416, ...)
and, when the request's start line and headers could be read, that request, so the answer can copy its
Via, From, To, Call-ID and CSeq; without it the message is dropped with a log line (RFC 3261 18.3).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

SIP_VERSION = "SIP/2.0"
MAX_HEADERS = 128  # header lines per message; a real one has about 15
MAX_CSEQ = 2**31 - 1

# RFC 3261 section 7.3.3 and the compact forms later RFCs added (Session-Expires is RFC 4028's x).
COMPACT_FORMS = {
    "v": "Via", "f": "From", "t": "To", "i": "Call-ID", "m": "Contact", "l": "Content-Length",
    "c": "Content-Type", "k": "Supported", "s": "Subject", "e": "Content-Encoding", "o": "Event",
    "u": "Allow-Events", "r": "Refer-To", "b": "Referred-By", "x": "Session-Expires",
}
# Header fields whose values are comma-separated lists (RFC 3261 7.3.1); the others may hold commas in a value.
LIST_HEADERS = frozenset({
    "via", "contact", "route", "record-route", "supported", "require", "proxy-require", "unsupported", "allow",
    "accept", "accept-encoding", "accept-language", "allow-events", "content-encoding", "path",
})
REQUIRED_IN_REQUESTS = ("Via", "From", "To", "Call-ID", "CSeq")

REASONS = {
    100: "Trying", 200: "OK", 202: "Accepted", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
    404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout", 413: "Request Entity Too Large",
    415: "Unsupported Media Type", 416: "Unsupported URI Scheme", 420: "Bad Extension",
    422: "Session Interval Too Small", 423: "Interval Too Brief", 481: "Call/Transaction Does Not Exist",
    483: "Too Many Hops", 486: "Busy Here", 487: "Request Terminated", 488: "Not Acceptable Here",
    491: "Request Pending", 500: "Server Internal Error", 501: "Not Implemented", 503: "Service Unavailable",
    513: "Message Too Large",
}

_TOKEN = r"[A-Za-z0-9.!%*_+`'~-]+"
_REQUEST_LINE = re.compile(rf"({_TOKEN}) (\S+) SIP/2\.0")
_STATUS_LINE = re.compile(r"SIP/2\.0 ([1-6][0-9][0-9]) ?(.*)")
_HEADER_NAME = re.compile(_TOKEN)
_DIGITS = re.compile(r"[0-9]{1,10}")
_LINE_END = re.compile(r"\r?\n")


class SipError(ValueError):
    """A message that cannot be taken as it is: `status` and `reason` are what a server answers (when
    `request` is set: the request as far as it could be read, enough to copy its dialog headers)."""

    def __init__(self, status: int, reason: str, request: Request | None = None) -> None:
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.request = request


@dataclass
class Message:
    """Header fields in order as (name, value) pairs (names as written, compact forms expanded) and the body."""

    headers: list[tuple[str, str]] = field(default_factory=list)
    body: str = ""

    def get(self, name: str, default: str | None = None) -> str | None:
        """The first value of header field `name` (any case); for list fields, its first element."""
        values = self.values(name)
        return values[0] if values else default

    def values(self, name: str) -> list[str]:
        """Every value of header field `name`, list fields split at their commas."""
        key = name.lower()
        found = [v for n, v in self.headers if n.lower() == key]
        if key in LIST_HEADERS:
            return [part for v in found for part in split_list(v)]
        return found

    def has(self, name: str) -> bool:
        key = name.lower()
        return any(n.lower() == key for n, _ in self.headers)

    @property
    def call_id(self) -> str:
        return self.get("Call-ID") or ""

    @property
    def cseq(self) -> tuple[int, str]:
        """(number, method) of the CSeq field; (0, "") when it is missing or unreadable."""
        return parse_cseq(self.get("CSeq") or "") or (0, "")

    @property
    def from_tag(self) -> str | None:
        return parse_address(self.get("From") or "").params.get("tag")

    @property
    def to_tag(self) -> str | None:
        return parse_address(self.get("To") or "").params.get("tag")

    @property
    def top_via(self) -> Via | None:
        value = self.get("Via")
        return parse_via(value) if value else None

    def _head_lines(self) -> list[str]:
        return [f"{name}: {value}" for name, value in self.headers if name.lower() != "content-length"]

    def _serialize(self, start_line: str) -> str:
        body_bytes = len(self.body.encode())
        head = [start_line, *self._head_lines(), f"Content-Length: {body_bytes}"]
        return "\r\n".join(head) + "\r\n\r\n" + self.body


@dataclass
class Request(Message):
    method: str = ""
    uri: str = ""

    def serialize(self) -> str:
        return self._serialize(f"{self.method} {self.uri} {SIP_VERSION}")


@dataclass
class Response(Message):
    status: int = 200
    reason: str = ""

    def serialize(self) -> str:
        reason = " ".join(self.reason.split())  # a reason phrase made from an error message stays on its line
        return self._serialize(f"{SIP_VERSION} {self.status} {reason}")


# -- parsing ------------------------------------------------------------------------------------------------
def parse(text: str, max_bytes: int) -> Request | Response:
    """One SIP message from one WebSocket message; raises `SipError` (see the module docstring)."""
    size = len(text.encode("utf-8", errors="replace"))
    if size > max_bytes:
        head = _split_head(text[: max_bytes])[0]
        request = _try_head(head)
        raise SipError(513, f"Message Too Large ({size} bytes, at most {max_bytes})", request)
    head, body = _split_head(text)
    message, problem = _parse_head(head)
    if message is None:
        raise SipError(400, problem or "Bad Request")
    body, body_problem = _checked_body(message, body)
    message.body = body
    problem = problem or body_problem
    if isinstance(message, Request):
        problem = problem or _request_problem(message)
    if problem:
        raise SipError(400, problem, message if isinstance(message, Request) else None)
    return message


def _split_head(text: str) -> tuple[str, str]:
    for separator in ("\r\n\r\n", "\n\n"):
        at = text.find(separator)
        if at >= 0:
            return text[:at], text[at + len(separator):]
    return text.rstrip("\r\n"), ""


def _try_head(head: str) -> Request | None:
    message, problem = _parse_head(head)
    return message if isinstance(message, Request) and problem is None else None


def _parse_head(head: str) -> tuple[Request | Response | None, str | None]:
    """The start line and header fields; the first problem met is returned beside what was read."""
    lines = _LINE_END.split(head.lstrip("\r\n"))  # RFC 3261 7.5: CRLFs before the start line are ignored
    start = lines[0]
    if match := _REQUEST_LINE.fullmatch(start):
        message: Request | Response = Request(method=match[1], uri=match[2])
    elif match := _STATUS_LINE.fullmatch(start):
        message = Response(status=int(match[1]), reason=match[2])
    else:
        return None, f"Bad start line {start[:60]!r}"
    problem = None
    headers = message.headers
    for line in lines[1:]:
        if line[:1] in (" ", "\t") and headers:  # folded: continues the previous value
            name, value = headers[-1]
            headers[-1] = (name, f"{value} {line.strip()}".strip())
            continue
        name, colon, value = line.partition(":")
        name = name.strip()
        if not colon or not _HEADER_NAME.fullmatch(name):
            problem = problem or f"Malformed header line {line[:60]!r}"
            continue
        if len(headers) >= MAX_HEADERS:
            return message, f"More than {MAX_HEADERS} header fields"
        headers.append((COMPACT_FORMS.get(name.lower(), name), value.strip()))
    return message, problem


def _checked_body(message: Message, body: str) -> tuple[str, str | None]:
    """The body as Content-Length says (the WebSocket frames the message, so the field may be absent)."""
    declared = message.get("Content-Length")
    if declared is None:
        return body, None
    if not _DIGITS.fullmatch(declared):
        return body, f"Bad Content-Length {declared[:20]!r}"
    length = int(declared)
    encoded = body.encode("utf-8", errors="replace")
    if len(encoded) < length:
        return body, f"Body shorter than its Content-Length ({len(encoded)} < {length})"
    return encoded[:length].decode("utf-8", errors="replace"), None


def _request_problem(request: Request) -> str | None:
    """What makes a request unusable (RFC 3261 8.2 and 16.3), or None."""
    for name in REQUIRED_IN_REQUESTS:
        if not request.has(name):
            return f"Missing {name} header field"
    cseq = parse_cseq(request.get("CSeq") or "")
    if cseq is None:
        return f"Bad CSeq {request.get('CSeq', '')[:30]!r}"
    if cseq[1] != request.method:
        return f"CSeq method {cseq[1][:20]!r} is not the request's {request.method[:20]!r}"
    via = request.top_via
    if via is None or not via.sent_by:
        return "Bad Via header field"
    for name in ("From", "To"):
        if not parse_address(request.get(name) or "").uri:
            return f"Bad {name} header field"
    max_forwards = request.get("Max-Forwards")
    if max_forwards is not None and not _DIGITS.fullmatch(max_forwards):
        return f"Bad Max-Forwards {max_forwards[:20]!r}"
    return None


def parse_count(value: str | None) -> int | None:
    """A header's number (Expires, Session-Expires, CSeq): ASCII digits only, at most ten; None otherwise
    (`str.isdigit` would take '²', which int() refuses)."""
    value = (value or "").strip()
    return int(value) if _DIGITS.fullmatch(value) else None


def parse_cseq(value: str) -> tuple[int, str] | None:
    number, _, method = value.strip().partition(" ")
    method = method.strip()
    if not _DIGITS.fullmatch(number) or int(number) > MAX_CSEQ or not _HEADER_NAME.fullmatch(method):
        return None
    return int(number), method


# -- header field values --------------------------------------------------------------------------------------
def split_list(value: str, separator: str = ",") -> list[str]:
    """`value` split at `separator`, except inside quotes and angle brackets; parts stripped, empty ones dropped."""
    parts, current, quoted, angle = [], [], False, False
    escaped = False
    for char in value:
        if escaped:
            escaped = False
        elif char == "\\" and quoted:
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == "<" and not quoted:
            angle = True
        elif char == ">" and not quoted:
            angle = False
        elif char == separator and not quoted and not angle:
            parts.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    parts.append("".join(current).strip())
    return [p for p in parts if p]


def parse_params(text: str) -> dict[str, str | None]:
    """`;a=1;b;c="x"` -> {"a": "1", "b": None, "c": '"x"'} (names lowercased, values as written)."""
    params: dict[str, str | None] = {}
    for part in split_list(text, ";"):
        name, eq, value = part.partition("=")
        params[name.strip().lower()] = value.strip() if eq else None
    return params


def format_params(params: dict[str, str | None]) -> str:
    return "".join(f";{k}" if v is None else f";{k}={v}" for k, v in params.items())


@dataclass(frozen=True)
class Address:
    """A name-addr or addr-spec with its header parameters (From, To, Contact)."""

    display: str
    uri: str
    params: dict[str, str | None]

    def with_params(self, **values: str | None) -> str:
        """The address written back, `values` added or replaced (a None value drops that parameter)."""
        params = {k: v for k, v in self.params.items() if k not in values}
        params.update({k: v for k, v in values.items() if v is not None})
        display = f"{self.display} " if self.display else ""
        return f"{display}<{self.uri}>{format_params(params)}"


def parse_address(value: str) -> Address:
    """`"Alice" <sip:alice@x;transport=ws>;tag=1` -> Address; an empty `uri` when it cannot be read."""
    value = value.strip()
    if value == "*":
        return Address("", "*", {})
    if "<" in value:
        display, _, rest = value.partition("<")
        uri, closed, params = rest.partition(">")
        if not closed:
            return Address("", "", {})
        return Address(display.strip(), uri.strip(), parse_params(params))
    uri, _, params = value.partition(";")  # addr-spec: its parameters are the header's (RFC 3261 20.10)
    return Address("", uri.strip() if " " not in uri.strip() else "", parse_params(params))


@dataclass(frozen=True)
class Uri:
    scheme: str
    user: str
    host: str
    port: int | None
    params: dict[str, str | None]


_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):\S")
_URI = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*):(?:(?P<user>[^@;?]*)(?::[^@;?]*)?@)?"
                  r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::(?P<port>[0-9]{1,5}))?"
                  r"(?P<params>;[^?]*)?(?:\?.*)?")


def parse_uri(uri: str) -> Uri | None:
    """A sip: or sips: URI in parts (another scheme's has only its scheme); None when it cannot be read."""
    scheme = _SCHEME.match(uri.strip())
    if scheme is None:
        return None
    if scheme[1].lower() not in ("sip", "sips"):
        return Uri(scheme[1].lower(), "", "", None, {})
    match = _URI.fullmatch(uri.strip())
    if match is None:
        return None
    port = int(match["port"]) if match["port"] else None
    return Uri(match["scheme"].lower(), match["user"] or "", match["host"].lower(), port,
               parse_params(match["params"] or ""))


@dataclass(frozen=True)
class Via:
    protocol: str  # e.g. SIP/2.0/WSS
    sent_by: str  # host[:port]
    params: dict[str, str | None]

    @property
    def branch(self) -> str | None:
        return self.params.get("branch")


def parse_via(value: str) -> Via | None:
    head, _, params = value.partition(";")
    protocol, _, sent_by = head.strip().partition(" ")
    if not protocol.upper().startswith("SIP/2.0/") or not sent_by.strip():
        return None
    return Via(protocol.upper(), sent_by.strip().lower(), parse_params(params))


# -- building -------------------------------------------------------------------------------------------------
def response_to(request: Request, status: int, reason: str | None = None, *, to_tag: str | None = None,
                headers: list[tuple[str, str]] | None = None, body: str = "") -> Response:
    """The response to `request`: its Via fields (in order), From, Call-ID and CSeq copied as they are, and its
    To with `to_tag` added when it has none (RFC 3261 8.2.6.2; a 100 Trying goes without), then `headers` and
    `body`."""
    copied = [("Via", v) for v in request.values("Via")]
    to = request.get("To") or ""
    if to_tag and status != 100 and parse_address(to).params.get("tag") is None:
        to = f"{to};tag={to_tag}"
    copied += [("From", request.get("From") or ""), ("To", to), ("Call-ID", request.call_id),
               ("CSeq", request.get("CSeq") or "")]
    return Response(headers=copied + list(headers or []), body=body, status=status,
                    reason=reason or REASONS.get(status, "Unknown"))
