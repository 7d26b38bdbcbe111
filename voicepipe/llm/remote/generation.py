"""`RemoteGeneration`: one streamed reply of a remote engine, a `llm.generation.Generation` whose pieces come from
the HTTP stream (`engine.py` feeds its queue) rather than from the engine thread."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from voicepipe.llm.generation import Generation, Piece


class RemoteGeneration(Generation):
    """``async for piece in generation`` yields a `Piece` per streamed delta (its ``token_ids`` hold the delta's
    index: one "token" per delta, see `engine.py`). Leaving the loop early, or `cancel()`, closes the HTTP stream at
    once; a failure of the server raises `RemoteBackendError` from the loop."""

    def __init__(self, request: Any, queue: asyncio.Queue, task: asyncio.Task) -> None:
        super().__init__(None, request, queue, stops=[])
        self._task = task

    def cancel(self) -> None:
        self._task.cancel()

    def pause(self, max_s: float) -> None:
        """A no-op: the remote server's cores are not the ones the TTS needs."""

    def resume(self) -> None:
        """A no-op (see `pause`)."""

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
