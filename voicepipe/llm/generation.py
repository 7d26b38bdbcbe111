"""What a caller of the engine holds: a `Generation` (one streamed reply, detokenized on the caller's side) and
the `Piece`s it yields; `_Event` is what the engine thread sends it.

A request that offered tools may come back as a tool call instead of text (`tools.py`): its pieces then carry no
text, only `tool_call` deltas, and `Generation.tool_calls` holds the call once the loop ends."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from voicepipe.llm.detok import IncrementalDetokenizer
from voicepipe.llm.request import Request, RequestStats
from voicepipe.llm.session import Session
from voicepipe.llm.tools import CallSplitter, ToolCall, ToolCallDelta


@dataclass
class Piece:
    """A piece of streamed reply text, the token ids it came from, and when they were produced (monotonic s); or,
    for a reply that is a tool call, a piece of the call (`text` is then empty)."""

    text: str
    token_ids: list[int]
    time: float
    # with SamplingParams.logprobs: one (log P(token), [(id, log P) of the top alternatives]) per token id
    logprobs: list[Any] | None = None
    tool_call: ToolCallDelta | None = None


@dataclass
class _Event:
    kind: str  # "tokens", "done", "error"
    token_ids: list[int] = field(default_factory=list)
    time: float = 0.0
    error: BaseException | None = None
    logprobs: list[Any] | None = None  # per token id, when the request asked for them


class Generation:
    """One streamed reply. ``async for piece in generation`` yields ``Piece``s; after the loop, ``text``,
    ``token_ids``, ``finish_reason`` and ``stats`` hold the outcome. Leaving the loop early (break, an
    exception, task cancellation) cancels the request within one engine step."""

    def __init__(self, engine: Any, request: Request, queue: asyncio.Queue, stops: list[str],
                 calls: CallSplitter | None = None) -> None:
        self._engine = engine  # the LLMEngine (engine.py imports this module)
        self.request = request
        self._queue = queue
        self._stops = stops
        self._calls = calls  # the request offered tools: the reply may be a call
        self._hold = max((len(s) for s in stops), default=1) - 1
        self.text = ""
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        # With ``end_probe``: resolves to ``stats.end_prob`` once the prompt's probe row is computed (None if the
        # request ends first, or asked for no probe)
        self.end_prob: asyncio.Future = request.end_prob_future
        self._started = False

    @property
    def tool_calls(self) -> list[ToolCall]:
        """The tool call the reply made (empty for a text reply), complete once the loop has ended."""
        return self._calls.calls if self._calls is not None else []

    @property
    def stats(self) -> RequestStats:
        return self.request.stats

    @property
    def session(self) -> Session:
        return self.request.session

    def cancel(self) -> None:
        self._engine._cancel(self.request)

    def pause(self, max_s: float) -> None:
        """Decode no more tokens of this reply until ``resume()``, or for ``max_s`` at most. A call pauses its reply
        while the TTS makes the first audio: on a CPU the two compete for the same cores, and the caller waits for
        that audio, not for the tokens after it."""
        self._engine._pause(self.request, time.monotonic() + max_s)

    def resume(self) -> None:
        self._engine._pause(self.request, 0.0)

    def __aiter__(self) -> AsyncIterator[Piece]:
        if self._started:
            raise RuntimeError("a Generation can be iterated once")
        self._started = True
        return self._stream()

    async def _stream(self) -> AsyncIterator[Piece]:
        detok = IncrementalDetokenizer(self._engine.tokenizer)
        emitted = 0  # chars of detok.text already yielded
        pending_ids: list[int] = []
        pending_logprobs: list[Any] | None = [] if self.request.params.logprobs is not None else None
        stop_ids = self.request.stop_ids
        try:
            while True:
                ev: _Event = await self._queue.get()
                if ev.kind == "error":
                    self.finish_reason = "error"
                    raise ev.error
                if ev.kind == "tokens":
                    self.token_ids.extend(ev.token_ids)
                    pending_ids.extend(ev.token_ids)
                    if pending_logprobs is not None:
                        pending_logprobs.extend(ev.logprobs or [])
                    visible = [t for t in ev.token_ids if t not in stop_ids or self.request.params.ignore_eos]
                    detok.push(visible)
                    full = detok.text
                    if self._calls is not None and self._calls.decide(full):  # stop strings are for text
                        delta = self._calls.delta(full)
                        if delta is not None:
                            yield Piece("", pending_ids, ev.time, tool_call=delta)
                            pending_ids = []
                        continue
                    cut = self._find_stop(full, emitted)
                    if cut is not None:
                        self._engine._stop_at(self.request, len(self.token_ids))
                        piece = full[emitted:cut]
                        self.text = full[:cut]
                        if piece:
                            yield Piece(piece, pending_ids, ev.time, pending_logprobs)
                        self.finish_reason = "stop"
                        await self._drain()
                        return
                    upto = max(emitted, len(full) - self._hold)
                    if upto > emitted:
                        yield Piece(full[emitted:upto], pending_ids, ev.time, pending_logprobs)
                        pending_ids = []
                        pending_logprobs = None if pending_logprobs is None else []
                        emitted = upto
                    continue
                # done
                detok.flush()
                full = detok.text
                self.finish_reason = self.request.finish_reason
                if self._calls is not None and self._calls.decide(full):
                    delta = self._calls.delta(full, final=True)
                    if delta is not None or pending_ids:
                        yield Piece("", pending_ids, time.monotonic(), tool_call=delta)
                    return
                self.text = full
                if len(full) > emitted or pending_ids:
                    yield Piece(full[emitted:], pending_ids, time.monotonic(), pending_logprobs)
                return
        finally:
            if self.finish_reason is None:
                self.cancel()

    def _find_stop(self, text: str, emitted: int) -> int | None:
        if not self._stops:
            return None
        start = max(0, emitted - self._hold)
        hits = [i for i in (text.find(s, start) for s in self._stops) if i >= 0]
        return min(hits) if hits else None

    async def _drain(self) -> None:
        while True:
            ev = await self._queue.get()
            if ev.kind != "tokens":
                return
