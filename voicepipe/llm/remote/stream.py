"""One streamed chat completion from an OpenAI-compatible server: the POST, its retries before the first token,
and the server-sent events read back as `Delta`s.

Retries: a connection that fails or times out, and the answers 408, 429, 500, 502, 503 and 504, are tried again
(`llm.retries` times, 0.1 s, 0.2 s, 0.4 s ... apart) as long as no piece of the reply has arrived; after that
the caller has heard part of the reply, so a failure ends it. Every failure is a `RemoteBackendError` that says
what the server did.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from voicepipe.llm.errors import LLMError

log = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
FIRST_BACKOFF_S = 0.1


class RemoteBackendError(LLMError):
    """The remote LLM server could not be reached, refused the request, or broke off its reply."""


@dataclass
class Delta:
    """One event of the stream: new reply text, the finish reason, or the usage (``stream_options.include_usage``)."""

    text: str = ""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None


def timeouts(connect_s: float, read_s: float) -> httpx.Timeout:
    """The read timeout bounds every wait for the next bytes: the first token and each gap between pieces."""
    return httpx.Timeout(connect=connect_s, read=read_s, write=read_s, pool=connect_s)


async def stream_chat(client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str],
                      retries: int, on_accepted: Callable[[], None] | None = None,
                      on_retry: Callable[[str], None] | None = None) -> AsyncIterator[Delta]:
    """POST ``body`` to ``url`` and yield its `Delta`s; ``on_accepted`` is called when the server answers 200."""
    attempt = 0
    while True:
        started = False
        try:
            async with client.stream("POST", url, json=body, headers=headers) as response:
                if response.status_code != 200:
                    reason = await _error_text(response)
                    if response.status_code in RETRYABLE_STATUS and attempt < retries:
                        raise _Retry(f"HTTP {response.status_code}: {reason}")
                    raise RemoteBackendError(f"the LLM server at {url} answered {response.status_code}: {reason}",
                                             _fix(response.status_code))
                if on_accepted is not None:
                    on_accepted()
                async for delta in _events(response):
                    started = started or bool(delta.text)
                    yield delta
                return
        except _Retry as retry:
            why = str(retry)
        except (httpx.TransportError, httpx.StreamError) as exc:  # refused, reset, timed out, cut short
            why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            if started or attempt >= retries:
                where = "in the middle of its reply" if started else f"after {attempt + 1} tries"
                raise RemoteBackendError(f"the LLM server at {url} failed {where}: {why}",
                                         "check that the server is up (llm.base_url) and answers within "
                                         "llm.read_timeout_s.") from None
        attempt += 1
        log.warning("LLM server at %s: %s; trying again (%d of %d)", url, why, attempt, retries)
        if on_retry is not None:
            on_retry(why)
        await asyncio.sleep(FIRST_BACKOFF_S * 2 ** (attempt - 1))


class _Retry(Exception):
    pass


async def _events(response: httpx.Response) -> AsyncIterator[Delta]:
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue  # blank separators, comments (": ping"), event names
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            raise RemoteBackendError(f"the LLM server sent an event that is not JSON: {data[:80]!r}",
                                     "point llm.base_url at an OpenAI-compatible /v1.") from None
        if not isinstance(chunk, dict):
            continue
        if "error" in chunk:  # vLLM and SGLang report a failure inside the stream
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else error
            raise RemoteBackendError(f"the LLM server failed the request: {message}")
        usage = chunk.get("usage") if isinstance(chunk.get("usage"), dict) else None
        choices = chunk.get("choices") or []
        choice = choices[0] if choices and isinstance(choices[0], dict) else {}
        delta = choice.get("delta") or {}
        text = delta.get("content") if isinstance(delta, dict) else None
        yield Delta(text if isinstance(text, str) else "", choice.get("finish_reason"), usage)


async def _error_text(response: httpx.Response) -> str:
    raw = (await response.aread())[:2000]
    try:
        body = json.loads(raw)
        error = body.get("error", body) if isinstance(body, dict) else body
        message = error.get("message") if isinstance(error, dict) else error
        return str(message)[:300]
    except ValueError:
        return raw.decode("utf-8", "replace").strip()[:300] or response.reason_phrase


def _fix(status: int) -> str:
    if status in (401, 403):
        return "set llm.api_key to the server's key."
    if status == 404:
        return "check llm.base_url (it ends in /v1) and llm.model (the server's /v1/models lists its ids)."
    if status == 400:
        return "the server refused the request's fields; see its log."
    return "see the LLM server's log."
