"""Graceful drain: `DrainingServer` is uvicorn's server with SIGTERM turned into a drain.

On the first SIGTERM the admission stops taking calls (so /ready answers 503 at once and new calls are refused
the way each transport expects), the calls in progress go on until they end or `server.drain_timeout_s` passes,
and only then does uvicorn shut down as usual: the lifespan's shutdown commits the call store, and the process
exits 0. A second SIGTERM (or a SIGINT) during the drain stops at once, as uvicorn does on a repeated Ctrl-C.
A drain timeout of 0 turns the drain off: SIGTERM stops as uvicorn always did.
"""

from __future__ import annotations

import logging
import signal
import time
from types import FrameType

import uvicorn

log = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, admission, drain_timeout_s: float) -> None:
        super().__init__(config)
        self.admission = admission  # pipeline.admission.Admission
        self.drain_timeout_s = drain_timeout_s
        self.drain_deadline: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and self.drain_deadline is None and self.drain_timeout_s > 0:
            self.drain_deadline = time.monotonic() + self.drain_timeout_s
            self.admission.drain()  # not recorded as a captured signal: a finished drain exits 0
            log.info("SIGTERM: draining; %d call(s) in progress, waiting up to %g s (SIGTERM again to stop now)",
                     self.admission.active, self.drain_timeout_s)
            return
        if self.drain_deadline is not None:
            log.warning("stopping now: %d call(s) still in progress are cut", self.admission.active)
            self.force_exit = True
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if self.drain_deadline is not None and not self.should_exit:
            if self.admission.active == 0:
                log.info("drained: no call in progress; stopping")
                self.should_exit = True
            elif time.monotonic() >= self.drain_deadline:
                log.warning("drain timeout (server.drain_timeout_s = %g s): stopping with %d call(s) in progress",
                            self.drain_timeout_s, self.admission.active)
                self.should_exit = True
        return await super().on_tick(counter)
