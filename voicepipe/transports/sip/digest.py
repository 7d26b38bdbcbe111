"""HTTP digest authentication as SIP uses it (RFC 3261 22.4 with RFC 2617's MD5 and qop=auth), both ends.

The server (`DigestServer`) challenges with a nonce that carries its issue time, a salt and an HMAC of both, so it
keeps no state per nonce beyond the highest nonce count seen (a bounded table, against replays); a nonce older
than `nonce_ttl_s` is answered with a fresh one marked `stale=true`, which clients retry without asking the
user. The client's end (`authorization`) is what `voicepipe call --transport sip` and the tests send.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from voicepipe.transports.sip.message import Request, parse_uri, split_list

NONCE_TTL_S = 300.0
MAX_TRACKED_NONCES = 4096


def md5_hex(text: str) -> str:
    return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()


def parse_digest(value: str) -> dict[str, str] | None:
    """The parameters of a `Digest ...` challenge or credentials (quotes removed); None if it is not Digest."""
    scheme, _, rest = value.strip().partition(" ")
    if scheme.lower() != "digest":
        return None
    out = {}
    for part in split_list(rest):
        name, eq, raw = part.partition("=")
        if eq:
            raw = raw.strip()
            out[name.strip().lower()] = raw[1:-1] if len(raw) >= 2 and raw[0] == raw[-1] == '"' else raw
    return out


def digest_response(user: str, realm: str, password: str, method: str, uri: str, nonce: str, nc: str,
                    cnonce: str, qop: str = "auth") -> str:
    ha1 = md5_hex(f"{user}:{realm}:{password}")
    ha2 = md5_hex(f"{method}:{uri}")
    return md5_hex(f"{ha1}:{nonce}:{nc}:{cnonce}:{qop}:{ha2}")


@dataclass(frozen=True)
class AuthResult:
    """`user` when the credentials hold; otherwise why not (for the log) and whether the nonce only expired."""

    user: str | None
    why: str = ""
    stale: bool = False


class DigestServer:
    """Checks a request's `Authorization` against `users` (user -> password) in `realm`."""

    def __init__(self, realm: str, users: Mapping[str, str], nonce_ttl_s: float = NONCE_TTL_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.realm = realm
        self.users = dict(users)
        self.nonce_ttl_s = nonce_ttl_s
        self.clock = clock
        self._secret = secrets.token_bytes(32)
        self._counts: OrderedDict[str, int] = OrderedDict()  # nonce -> highest nc seen

    def challenge(self, stale: bool = False) -> str:
        """A `WWW-Authenticate` value with a fresh nonce."""
        issued = f"{int(self.clock() * 1000):x}.{secrets.token_hex(4)}"  # when, and a salt: fresh every time
        nonce = f"{issued}.{self._sign(issued)}"
        return (f'Digest realm="{self.realm}", nonce="{nonce}", algorithm=MD5, qop="auth"'
                + (", stale=true" if stale else ""))

    def check(self, request: Request) -> AuthResult:
        header = request.get("Authorization")
        if header is None:
            return AuthResult(None, "no credentials")
        creds = parse_digest(header)
        if creds is None:
            return AuthResult(None, "not Digest credentials")
        user, nonce = creds.get("username", ""), creds.get("nonce", "")
        if creds.get("realm") != self.realm or creds.get("algorithm", "MD5").upper() != "MD5":
            return AuthResult(None, f"realm or algorithm not ours (user {user[:40]!r})")
        if creds.get("qop") != "auth" or not creds.get("cnonce") or not creds.get("nc"):
            return AuthResult(None, "qop=auth with cnonce and nc is required")
        if not self._uri_matches(creds.get("uri", ""), request.uri):
            return AuthResult(None, "the digest uri is not the Request-URI")
        issued, _, signature = nonce.rpartition(".")
        if not hmac.compare_digest(signature.encode(), self._sign(issued).encode()):
            return AuthResult(None, "a nonce this server did not issue")
        password = self.users.get(user)
        expected = digest_response(user, self.realm, password or "", request.method, creds["uri"], nonce,
                                   creds["nc"], creds["cnonce"])
        if password is None or not hmac.compare_digest(expected, creds.get("response", "")):
            return AuthResult(None, f"wrong user or password (user {user[:40]!r})")
        if self.clock() * 1000 - int(issued.partition(".")[0], 16) > self.nonce_ttl_s * 1000:
            return AuthResult(None, "the nonce expired", stale=True)
        if not self._count_is_new(nonce, creds["nc"]):
            return AuthResult(None, "a nonce count seen before (a replay)")
        return AuthResult(user)

    def _sign(self, issued: str) -> str:
        return hmac.new(self._secret, f"{issued}:{self.realm}".encode(), hashlib.sha256).hexdigest()[:32]

    @staticmethod
    def _uri_matches(digest_uri: str, request_uri: str) -> bool:
        a, b = parse_uri(digest_uri), parse_uri(request_uri)
        return a is not None and b is not None and (a.scheme, a.user, a.host, a.port) == (b.scheme, b.user, b.host,
                                                                                              b.port)

    def _count_is_new(self, nonce: str, nc: str) -> bool:
        try:
            count = int(nc, 16)
        except ValueError:
            return False
        if count <= self._counts.get(nonce, 0):
            return False
        self._counts[nonce] = count
        self._counts.move_to_end(nonce)
        while len(self._counts) > MAX_TRACKED_NONCES:
            self._counts.popitem(last=False)
        return True


def authorization(challenge: str, method: str, uri: str, user: str, password: str, nc: int = 1,
                  cnonce: str | None = None) -> str:
    """The client's `Authorization` value answering `challenge` (a `WWW-Authenticate` value)."""
    params = parse_digest(challenge) or {}
    realm, nonce = params.get("realm", ""), params.get("nonce", "")
    cnonce = cnonce or secrets.token_hex(8)
    count = f"{nc:08x}"
    response = digest_response(user, realm, password, method, uri, nonce, count, cnonce)
    return (f'Digest username="{user}", realm="{realm}", nonce="{nonce}", uri="{uri}", response="{response}", '
            f'algorithm=MD5, cnonce="{cnonce}", qop=auth, nc={count}')
