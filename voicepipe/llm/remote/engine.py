"""`RemoteEngine`: the engine interface a call uses (`LLMEngine`'s session API), served by an OpenAI-compatible
server (`llm.backend = "openai"`): vLLM, SGLang, llama.cpp's server or another voicepipe's `/v1`.

A `RemoteSession` holds the conversation as messages, here; each turn POSTs the whole history plus the new
messages, streamed. The history is sent back byte for byte as it was sent and received (the system prompt first,
every reply as it streamed in), so the server's prefix cache holds every earlier turn and only the new words are
prefilled; the server's ``cached_tokens`` (``stream_options.include_usage``) lands in the request's stats. A
"token" here is one streamed delta (a remote server sends text, not ids): `rollback_reply` keeps the first N deltas
of the last reply, as the call counts them from the `Piece`s it was given.

What the in-process engine does that a remote one cannot: `prefill_user_words` is a no-op (an OpenAI server has
no prefill-only request), and `Generation.pause` is a no-op (the server's cores are not the TTS's). The end probe
needs the logits of specific tokens after the caller's words, which the chat API does not give: with
`llm.tokenizer` it is a second request (`probe.py`); without it `scores_words` is False and the call's end-of-turn
policy goes without the text evidence (`text` runs as `silence`).

Everything runs on the event loop of the call that asks (one httpx client per loop: AudioSocket calls have their
own loop); request listeners are called there too.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from voicepipe.config import LLMSettings
from voicepipe.llm.chat import validate_messages
from voicepipe.llm.errors import EngineStoppedError, InvalidRequestError, SessionBusyError, SessionClosedError
from voicepipe.llm.remote.generation import RemoteGeneration
from voicepipe.llm.remote.probe import EndProbe
from voicepipe.llm.remote.stream import RemoteBackendError, stream_chat, timeouts
from voicepipe.llm.request import RequestStats, tier_rank

log = logging.getLogger(__name__)

_ids = itertools.count(1)


@dataclass(eq=False)
class RemoteSession:
    """One call's conversation with a remote engine. Open it with ``engine.open_session()``."""

    system_prompt: str | None = None
    id: int = field(default_factory=lambda: next(_ids))
    key: str = field(default_factory=lambda: uuid.uuid4().hex)  # the session-affinity key sent with each request
    messages: list[dict[str, str]] = field(default_factory=list)  # the history, the last reply included
    marks: list[int] = field(default_factory=list)  # len(messages) before each turn
    reply: list[str] | None = None  # the last reply's deltas (its message is messages[-1])
    busy: bool = False
    closed: bool = False
    ephemeral: bool = False  # never: a remote engine serves calls only (for the metrics' labels)
    requests: int = 0  # the turns' generations, less those dropped: the turn count (labels TTFT in metrics)
    task: asyncio.Task | None = None  # the request in flight

    def __post_init__(self) -> None:
        if self.system_prompt:
            self.messages.append({"role": "system", "content": self.system_prompt})


@dataclass(eq=False)
class RemoteRequest:
    """What request listeners get (the fields `LLMEngine`'s requests share with it)."""

    session: RemoteSession
    tier: str
    stats: RequestStats
    finish_reason: str | None = None
    end_prob_future: Any = None
    done: bool = False  # _finish ran (once)


class RemoteEngine:
    backend = "openai"

    def __init__(self, settings: LLMSettings, prober: EndProbe | None = None) -> None:
        self.settings = settings
        self.url = settings.base_url.rstrip("/")
        self.model = settings.model
        self.prober = prober  # None: generate(end_probe=True) resolves end_prob to None
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = \
            weakref.WeakKeyDictionary()
        self._sessions: dict[int, RemoteSession] = {}
        self._probes: set[asyncio.Task] = set()
        self._running = False
        self._request_listeners: list[Callable[[RemoteRequest], None]] = []
        self.counters = {"requests": 0, "finished": 0, "cancelled": 0, "errors": 0, "overloaded": 0, "retries": 0,
                         "prompt_tokens": 0, "cached_prompt_tokens": 0, "output_tokens": 0}

    @property
    def scores_words(self) -> bool:
        """Whether `generate(end_probe=True)` gives the text evidence of the end-of-turn policy."""
        return self.prober is not None

    # -- lifecycle ------------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Ask the server which model it serves (when llm.model is not set). A server that is not up yet is
        logged, not fatal: the first call asks again."""
        self._running = True
        if self.model is None:
            try:
                self.model = _first_model(httpx.get(f"{self.url}/models", headers=self._auth(),
                                                    timeout=self._timeout()).json())
                log.info("LLM backend %s serves %s", self.url, self.model)
            except Exception as exc:
                log.warning("LLM backend %s: could not list its models (%s); the first call asks again", self.url, exc)

    def stop(self) -> None:
        self._running = False
        for session in list(self._sessions.values()):
            if session.task is not None:
                session.task.get_loop().call_soon_threadsafe(session.task.cancel)
        for loop, client in list(self._clients.items()):
            if not loop.is_closed():
                loop.call_soon_threadsafe(lambda c=client: asyncio.ensure_future(c.aclose()))
        self._clients.clear()

    close = stop

    def add_request_listener(self, listener: Callable[[RemoteRequest], None]) -> None:
        """As `LLMEngine.add_request_listener`; called on the event loop of the call."""
        self._request_listeners.append(listener)

    # -- sessions -------------------------------------------------------------------------------------------------
    def open_session(self, system_prompt: str | None = None) -> RemoteSession:
        session = RemoteSession(system_prompt)
        self._sessions[session.id] = session
        return session

    def close_session(self, session: RemoteSession) -> None:
        if session.closed:
            return
        session.closed = True
        self._sessions.pop(session.id, None)
        if session.task is not None and not session.task.done():
            session.task.cancel()

    def history(self, session: RemoteSession) -> list[dict[str, str]]:
        return [dict(m) for m in session.messages]

    def drop_turns(self, session: RemoteSession, keep: int) -> None:
        """Forget every turn after the first ``keep``: their messages and replies."""
        self._check_idle(session)
        if 0 <= keep < len(session.marks):
            self._restore_mark(session, keep)

    def rollback_reply(self, session: RemoteSession, heard_tokens: int) -> None:
        """Barge-in: the last reply keeps only its first ``heard_tokens`` deltas (what the caller heard)."""
        self._check_idle(session)
        if session.reply is None:
            raise InvalidRequestError("the session has no reply to roll back.", "call it after a generation.")
        kept = session.reply[:max(0, heard_tokens)]
        session.reply = kept
        session.messages[-1] = {"role": "assistant", "content": "".join(kept)}

    def prefill_user_words(self, session: RemoteSession, words: str) -> None:
        """A no-op: an OpenAI-compatible server has no request that only prefills."""

    def _restore_mark(self, session: RemoteSession, keep: int) -> None:
        session.messages = session.messages[:session.marks[keep]]
        session.requests -= len(session.marks) - keep
        session.marks = session.marks[:keep]
        session.reply = None

    def _check_idle(self, session: RemoteSession) -> None:
        if session.closed:
            raise SessionClosedError(f"session {session.id} is closed.", "open a new session.")
        if session.busy:
            raise SessionBusyError(f"session {session.id} has a generation in flight.",
                                   "cancel it or wait for it to end.")

    # -- requests -------------------------------------------------------------------------------------------------
    def generate(self, session: RemoteSession, new_messages: list[dict[str, str]], tier: str = "default",
                 params: Any = None, end_probe: bool = False, **sampling: Any) -> RemoteGeneration:
        """Start a streamed reply to ``new_messages`` appended to ``session``; iterate the result with
        ``async for``. Sampling keywords: max_tokens, temperature, top_p, seed, stop."""
        if not self._running:
            raise EngineStoppedError("the remote LLM backend is not started.", "call engine.start() first.")
        if session is None:
            raise InvalidRequestError("a remote engine serves sessions only.", "open a session first.")
        if params is not None:
            sampling = {k: getattr(params, k) for k in ("max_tokens", "temperature", "top_p", "seed", "stop")}
        if sampling.get("tools"):  # a call's own `tools` parameter: the settings refuse them with a remote backend
            raise InvalidRequestError("tools are not supported over a remote LLM backend yet.",
                                      "drop the call's tools, or set llm.backend = \"local\".")
        tier_rank(tier)
        new = validate_messages(new_messages)
        self._check_idle(session)
        loop = asyncio.get_running_loop()
        session.marks.append(len(session.messages))
        session.messages.extend(new)
        session.reply = []  # the deltas as they arrive
        session.busy = True
        session.requests += 1
        self.counters["requests"] += 1
        request = RemoteRequest(session, tier, RequestStats(arrival=time.monotonic()),
                                end_prob_future=loop.create_future())
        queue: asyncio.Queue = asyncio.Queue()
        body = self._body(session, sampling)
        session.task = loop.create_task(self._run(request, body, queue), name=f"llm-remote-{session.id}")
        session.task.add_done_callback(lambda task: self._cancelled(request, queue))
        prompt = self.prober.prompt(session.messages) if end_probe and self.prober is not None else None
        if prompt is None:  # not asked, no tokenizer for it, or no words to score
            request.end_prob_future.set_result(None)
        else:
            probe = loop.create_task(self._probe(request, prompt), name=f"llm-remote-probe-{session.id}")
            self._probes.add(probe)  # asyncio keeps only a weak reference to a task
            probe.add_done_callback(self._probes.discard)
        return RemoteGeneration(request, queue, session.task)

    def _body(self, session: RemoteSession, sampling: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {"messages": [dict(m) for m in session.messages], "stream": True,
                                "stream_options": {"include_usage": True}, "user": session.key,
                                "max_tokens": sampling.get("max_tokens") or self.settings.default_max_tokens}
        for key in ("temperature", "top_p", "seed"):
            if sampling.get(key) is not None:
                body[key] = sampling[key]
        if sampling.get("stop"):
            body["stop"] = list(sampling["stop"])
        return body

    async def _run(self, request: RemoteRequest, body: dict[str, Any], queue: asyncio.Queue) -> None:
        session, stats = request.session, request.stats
        deltas = 0

        def accepted() -> None:
            stats.first_scheduled = time.monotonic()

        def retried(_why: str) -> None:
            self.counters["retries"] += 1

        try:
            body["model"] = await self._model_id()
            async for delta in stream_chat(self._client(), f"{self.url}/chat/completions", body,
                                           self._headers(session), self.settings.retries, accepted, retried):
                if delta.usage is not None:
                    _apply_usage(stats, delta.usage)
                if delta.finish_reason:
                    request.finish_reason = "length" if delta.finish_reason == "length" else "stop"
                if delta.text:
                    now = time.monotonic()
                    if stats.first_token is None:
                        stats.first_token = now
                    stats.token_times.append(now)
                    deltas += 1
                    session.reply.append(delta.text)
                    queue.put_nowait(("text", delta.text, now))
            stats.output_tokens = max(stats.output_tokens, deltas)
            self._finish(request, request.finish_reason or "stop")
            queue.put_nowait(("done", None, time.monotonic()))
        except asyncio.CancelledError:  # `_cancelled` ends the request
            stats.output_tokens = max(stats.output_tokens, deltas)
            raise
        except RemoteBackendError as exc:
            self._finish(request, "error")
            queue.put_nowait(("error", exc, time.monotonic()))
        except Exception as exc:  # a bug here fails this reply, never the call
            log.exception("remote LLM request failed")
            self._finish(request, "error")
            queue.put_nowait(("error", RemoteBackendError(f"the remote LLM request failed: {exc}"),
                              time.monotonic()))

    async def _probe(self, request: RemoteRequest, prompt: str) -> None:
        future = request.end_prob_future
        try:
            value = await self.prober.ask(self._client(), self.url, await self._model_id(), prompt,
                                          self._headers(request.session), request.session.key)
        except RemoteBackendError:  # no model id: the reply itself reports it
            value = None
        request.stats.end_prob = value
        if not future.done():
            future.set_result(value)

    def _cancelled(self, request: RemoteRequest, queue: asyncio.Queue) -> None:
        """The request's task is over: if it was cancelled (even before it started), end the request and wake a
        reader of its queue."""
        if not request.done:
            self._finish(request, "cancelled")
            queue.put_nowait(("done", None, time.monotonic()))

    def _finish(self, request: RemoteRequest, reason: str) -> None:
        session, stats = request.session, request.stats
        request.done = True
        request.finish_reason = reason
        stats.finished = time.monotonic()
        session.busy = False
        session.task = None
        if reason == "error" and not session.reply and session.marks:
            self._restore_mark(session, len(session.marks) - 1)  # the failed turn leaves no trace in the history
        elif not session.closed:
            session.messages.append({"role": "assistant", "content": "".join(session.reply or [])})
        key = {"cancelled": "cancelled", "error": "errors"}.get(reason, "finished")
        self.counters[key] += 1
        self.counters["prompt_tokens"] += stats.prompt_tokens
        self.counters["cached_prompt_tokens"] += stats.cached_prompt_tokens
        self.counters["output_tokens"] += stats.output_tokens
        for listener in self._request_listeners:
            try:
                listener(request)
            except Exception:
                log.exception("request listener %r failed", listener)

    # -- HTTP -----------------------------------------------------------------------------------------------------
    def _timeout(self) -> httpx.Timeout:
        return timeouts(self.settings.connect_timeout_s, self.settings.read_timeout_s)

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = httpx.AsyncClient(timeout=self._timeout(), limits=httpx.Limits(max_keepalive_connections=64))
            self._clients[loop] = client
        return client

    def _auth(self) -> dict[str, str]:
        key = self.settings.api_key
        return {"Authorization": f"Bearer {key.get_secret_value()}"} if key is not None else {}

    def _headers(self, session: RemoteSession) -> dict[str, str]:
        return {**self._auth(), self.settings.session_header: session.key}

    async def _model_id(self) -> str:
        if self.model is None:
            try:
                response = await self._client().get(f"{self.url}/models", headers=self._auth())
                self.model = _first_model(response.json())
            except Exception as exc:
                raise RemoteBackendError(f"the LLM server at {self.url} did not list its models: {exc}",
                                         "check llm.base_url, or set llm.model.") from None
        return self.model

    # -- stats ----------------------------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        prompt = self.counters["prompt_tokens"]
        running = sum(1 for s in self._sessions.values() if s.busy)
        return {**self.counters, "backend": self.backend, "sessions": len(self._sessions), "running": running,
                "waiting": 0, "prefix_hit_rate": self.counters["cached_prompt_tokens"] / prompt if prompt else 0.0}


def _apply_usage(stats: RequestStats, usage: dict[str, Any]) -> None:
    """The server's own count: prompt tokens, the part of them its prefix cache served, and the reply's tokens."""
    details = usage.get("prompt_tokens_details") or {}
    for attr, value in (("prompt_tokens", usage.get("prompt_tokens")),
                        ("cached_prompt_tokens", details.get("cached_tokens") if isinstance(details, dict) else None),
                        ("output_tokens", usage.get("completion_tokens"))):
        if isinstance(value, int) and value >= 0:
            setattr(stats, attr, value)


def _first_model(listing: Any) -> str:
    data = listing.get("data") if isinstance(listing, dict) else None
    if not data or not isinstance(data[0], dict) or not isinstance(data[0].get("id"), str):
        raise ValueError("its /models lists no model")
    return data[0]["id"]
