"""The shared secret (`calls.auth_token`) that guards the call endpoints, the call store's API and the dashboard.

A client brings it as `Authorization: Bearer …`, `x-voicepipe-token`, Telnyx's `x-telnyx-streaming-auth-token`,
or `?token=…`. With no token set, everything is open.
"""

from __future__ import annotations

import hmac

from fastapi import HTTPException, Request

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
