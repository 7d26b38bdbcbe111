"""HTTP for a call's tools: POST a webhook tool's call (its answer becomes the tool's result) and the transfer
notice to the telephony bridge. Every failure is a `ToolError` whose message the model can talk about."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import httpx


class ToolError(Exception):
    """A tool call that failed: the message is what the model is told."""


@dataclass(frozen=True)
class WebhookAnswer:
    result: str  # what the model reads (the answer's body, cut to the limit)
    say: str = ""  # a JSON answer's "say": spoken word for word as the start of the agent's reply


async def post_json(url: str, payload: dict[str, Any], timeout_s: float,
                    headers: dict[str, str] | None = None) -> httpx.Response:
    """POST `payload` as JSON; a timeout (of the whole exchange, not only of each read), a refused connection or an
    HTTP error status is a ToolError."""
    try:
        async with asyncio.timeout(timeout_s), httpx.AsyncClient(timeout=timeout_s) as client:
            response = await client.post(url, json=payload, headers=headers or {})
    except (httpx.TimeoutException, TimeoutError):
        raise ToolError(f"no answer within {timeout_s:g} s") from None
    except httpx.HTTPError as exc:
        raise ToolError(f"the service could not be reached ({type(exc).__name__})") from None
    if response.status_code >= 400:
        raise ToolError(f"the service answered HTTP {response.status_code}: {response.text[:200]}")
    return response


async def call_webhook(url: str, payload: dict[str, Any], timeout_s: float, headers: dict[str, str],
                       max_chars: int) -> WebhookAnswer:
    response = await post_json(url, payload, timeout_s, headers)
    text = response.text.strip()
    say = ""
    try:
        body = json.loads(text) if text else None
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("say"), str):
        say = " ".join(body["say"].split())
    return WebhookAnswer(text[:max_chars] or "{}", say)
