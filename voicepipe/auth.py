"""The guards of the HTTP and WebSocket surface: the shared secret (`calls.auth_token`) that guards the call
endpoints, the call store's API, the dashboard, recordings and the metrics; Twilio's request signature; and the
check on call ids that arrive in a path.

A client brings the token as `Authorization: Bearer …`, `x-voicepipe-token`, Telnyx's
`x-telnyx-streaming-auth-token`, or `?token=…`. With no token set, everything is open. (`/v1` has its own key,
`server.api_key`: llm/api/router.py.)
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Annotated
from urllib.parse import urlsplit, urlunsplit

from fastapi import HTTPException, Path, Request

TELNYX_AUTH_HEADER = "x-telnyx-streaming-auth-token"


def _expected_token(settings) -> str | None:
    token = settings.calls.auth_token
    return token.get_secret_value() if token is not None else None


def _offered_tokens(headers, query) -> list[str]:
    offered = []
    auth = headers.get("authorization")
    if auth and auth.lower().startswith("bearer "):
        offered.append(auth[7:].strip())
    for name in ("x-voicepipe-token", TELNYX_AUTH_HEADER):
        if headers.get(name):
            offered.append(headers[name])
    if query.get("token"):
        offered.append(query["token"])
    return offered


def token_ok(settings, headers, query) -> bool:
    """True when no token is set or one of the offered tokens matches it (compared in constant time)."""
    expected = _expected_token(settings)
    if expected is None:
        return True
    return any(hmac.compare_digest(t.encode(), expected.encode()) for t in _offered_tokens(headers, query))


def check_http_token(request: Request) -> None:
    """Raise HTTP 401 unless the request brings the token."""
    if not token_ok(request.app.state.settings, request.headers, request.query_params):
        raise HTTPException(401, "missing or wrong token")


TWILIO_SIGNATURE_HEADER = "x-twilio-signature"
MAX_CALL_ID_CHARS = 128  # the native protocol's bound; no call has a longer id


def twilio_signature(auth_token: str, url: str, params: dict[str, str] | None = None) -> str:
    """Twilio's request signature: base64 of HMAC-SHA1, keyed with the account's auth token, over the full URL
    followed by each POST parameter's name and value, sorted by name (a WebSocket upgrade has none)."""
    data = url + "".join(f"{key}{value}" for key, value in sorted((params or {}).items()))
    digest = hmac.new(auth_token.encode(), data.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


def _url_variants(url: str) -> list[str]:
    """The URL as this server saw it and as Twilio may have signed it: behind a TLS proxy the scheme differs
    (ws / wss), and the Host header may or may not carry the default port."""
    parts = urlsplit(url)
    other = {"ws": "wss", "wss": "ws", "http": "https", "https": "http"}.get(parts.scheme, parts.scheme)
    hosts = {parts.netloc, parts.hostname or parts.netloc}
    return [urlunsplit((scheme, host, parts.path, parts.query, "")) for scheme in (parts.scheme, other)
            for host in sorted(hosts)]


def twilio_signature_ok(auth_token: str, url: str, headers) -> bool:
    """True when the request's X-Twilio-Signature matches its URL under `auth_token` (constant-time compare)."""
    offered = headers.get(TWILIO_SIGNATURE_HEADER)
    if not offered:
        return False
    return any(hmac.compare_digest(offered.encode(), twilio_signature(auth_token, candidate).encode())
               for candidate in _url_variants(url))


# A call id in a path, as the OpenAPI description states it (`check_path_call_id` checks it again in the code)
CallIdPath = Annotated[str, Path(min_length=1, max_length=MAX_CALL_ID_CHARS, pattern=r"^[^\x00-\x1f\x7f]+$",
                                 description="a call's id: 1 to 128 characters, none a control character")]


def is_call_id(value: str) -> bool:
    """Whether a call may be known by `value`: 1 to MAX_CALL_ID_CHARS characters, none a control character."""
    return 0 < len(value) <= MAX_CALL_ID_CHARS and not any(ord(c) < 32 or ord(c) == 127 for c in value)


def check_path_call_id(call_id: str) -> None:
    """HTTP 400 for a call id in a path that no call can have (`is_call_id`: too long, NUL or another control
    character). Other ids are looked up as they are: one that names no call is a 404, never a file elsewhere."""
    if not is_call_id(call_id):
        raise HTTPException(400, f"not a call id (1 to {MAX_CALL_ID_CHARS} printable characters)")
