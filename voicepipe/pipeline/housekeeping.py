"""A call's background tasks (spawned chores, their failures logged) and its idle watch (`calls.idle_timeout_s`)."""

from __future__ import annotations

import asyncio
import logging
import time

log = logging.getLogger("voicepipe.pipeline.session")  # the call's log lines keep the session's logger


class Housekeeping:
    """CallSession's background tasks and idle watch (a mixin).

    Reads and writes `_tasks` and `_last_activity`; reads `cfg`, `closed`, `_reply`, `_speech_start` and `output`;
    the idle watch sets `end_reason` and `ended`."""

    def _spawn(self, coro, name: str) -> None:
        task = asyncio.create_task(coro, name=f"{name}-{self.call_id}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("call %s: %s failed: %r", self.call_id, task.get_name(), task.exception())

    async def _watch_idle(self) -> None:
        limit = self.cfg.idle_timeout_s
        while not self.closed:
            await asyncio.sleep(min(1.0, limit / 4))
            busy = self._reply is not None or self._speech_start is not None or self.output.is_playing()
            if busy:
                self._last_activity = time.monotonic()
            elif time.monotonic() - self._last_activity > limit:
                log.info("call %s: idle for %.0f s, hanging up", self.call_id, limit)
                self.end_reason = "idle_timeout"
                self.ended.set()
                return
