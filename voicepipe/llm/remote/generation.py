"""`RemoteGeneration`: one streamed reply of a remote engine, with the surface of `llm.generation.Generation`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from voicepipe.llm.generation import Piece
from voicepipe.llm.request import RequestStats


class RemoteGeneration:
    """``async for piece in generation`` yields a `Piece` per streamed delta (its ``token_ids`` hold the delta's
    index: one "token" per delta, see `engine.py`). Leaving the loop early, or `cancel()`, closes the HTTP stream at
    once; a failure of the server raises `RemoteBackendError` from the loop."""

    def __init__(self, request: Any, queue: asyncio.Queue, task: asyncio.Task) -> None:
        self.request = request
        self._queue = queue
        self._task = task
        self.text = ""
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self.end_prob: asyncio.Future = request.end_prob_future
        self._started = False

    @property
    def stats(self) -> RequestStats:
        return self.request.stats

    @property
    def session(self) -> Any:
        return self.request.session

    def cancel(self) -> None:
        self._task.cancel()

    def pause(self, max_s: float) -> None:
        """A no-op: the remote server's cores are not the ones the TTS needs."""

    def resume(self) -> None:
        """A no-op (see `pause`)."""

    def __aiter__(self) -> AsyncIterator[Piece]:
        if self._started:
            raise RuntimeError("a Generation can be iterated once")
        self._started = True
        return self._stream()

    async def _stream(self) -> AsyncIterator[Piece]:
        try:
            while True:
                kind, value, at = await self._queue.get()
                if kind == "error":
                    self.finish_reason = "error"
                    raise value
                if kind == "done":
                    self.finish_reason = self.request.finish_reason
                    return
                self.token_ids.append(len(self.token_ids))
                self.text += value
                yield Piece(value, [self.token_ids[-1]], at)
        finally:
            if self.finish_reason is None:
                self.cancel()
