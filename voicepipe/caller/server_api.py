"""What the caller asks the server over HTTP: whether the agent listens (`GET /calls/{id}`'s state), and the
call's record once it has ended."""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit, urlunsplit

import httpx


def http_base(url: str) -> str:
    """The server's HTTP root for a call URL (ws(s):// becomes http(s)://)."""
    parts = urlsplit(url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, "", "", ""))


def http_client(base: str, token: str | None) -> httpx.AsyncClient:
    """An httpx client for the server's HTTP API. Over plain http no certificates are loaded: loading them takes
    0.1-0.4 s of CPU on the event loop, which would delay the caller audio of every other call in flight."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(base_url=base, headers=headers, timeout=5, verify=base.startswith("https:"))


class ServerState:
    """Asks the server whether the agent is listening: a test caller's way to take turns exactly, where a human
    would wait for a pause (a slow clause can leave a gap in the agent's speech)."""

    def __init__(self, url: str, call_id: str, token: str | None) -> None:
        self.client = http_client(http_base(url), token)
        self.call_id = call_id

    async def state(self) -> str | None:
        try:
            resp = await self.client.get(f"/calls/{self.call_id}")
        except httpx.TransportError:
            return None
        return resp.json().get("state") if resp.status_code == 200 else None

    async def wait_listening(self, timeout: float, closed: asyncio.Event) -> None:
        """Until the agent listens (or the call has ended), `timeout` passes, or `closed` is set."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not closed.is_set():
            if await self.state() in ("listening", "ended"):
                return
            await asyncio.sleep(0.1)

    async def close(self) -> None:
        await self.client.aclose()


async def fetch_call_record(url: str, call_id: str, token: str | None = None, wait_s: float = 30.0) -> dict | None:
    """The server's record of the call (transcripts, timings, LLM cache figures), once it has ended."""
    deadline = time.monotonic() + wait_s
    record = None
    async with http_client(http_base(url), token) as client:
        while time.monotonic() < deadline:
            try:
                resp = await client.get(f"/calls/{call_id}")
            except httpx.TransportError:
                resp = None
            if resp is not None and resp.status_code == 200:
                record = resp.json()
                if record.get("ended") is not None:
                    return record
            await asyncio.sleep(0.2)
    return record
