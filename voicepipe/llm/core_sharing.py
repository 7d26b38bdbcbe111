"""How many threads the engine computes on while it shares the cores.

The fused kernels split each layer among torch's threads, which meet at spin barriers several times a layer. When
another process, or the call's own STT or TTS, takes the core of one of them, each barrier waits out the
scheduler's slice for it, and a step takes many times as long as on one thread: beside one spinning process on two
cores, the end probe's words came 354 ms after the VAD's speech end (p50) against 36 ms on one thread. So after a
barrier waited over a millisecond (``blockq.stalls``), the engine runs on one thread for a while, then tries all of
them again. A stall soon after such a try doubles the while (a core taken for good: one try a second at most); a
lone stall (the call's own threads, now and then) costs one short while."""

from __future__ import annotations

import time
from collections.abc import Callable

SHORTEST_ALONE_S = 0.05
LONGEST_ALONE_S = 1.0


class CoreSharing:
    """Set the engine thread's thread count after each step, from the kernels' stall count."""

    def __init__(self, stalls: Callable[[], int], set_threads: Callable[[int], None], threads: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._stalls, self._set_threads, self._clock = stalls, set_threads, clock
        self.threads = threads
        self._seen = stalls()
        self.alone_s = SHORTEST_ALONE_S  # the next while on one thread
        self._alone_until: float | None = None
        self._tried_at = float("-inf")  # when the last while on one thread ended

    @property
    def alone(self) -> bool:
        return self._alone_until is not None

    def after_step(self) -> None:
        stalls, now = self._stalls(), self._clock()
        if stalls != self._seen and self._alone_until is None and self.threads > 1:
            soon_after_a_try = now - self._tried_at < self.alone_s
            self.alone_s = min(2 * self.alone_s, LONGEST_ALONE_S) if soon_after_a_try else SHORTEST_ALONE_S
            self._alone_until = now + self.alone_s
            self._set_threads(1)
        elif self._alone_until is not None and now >= self._alone_until:
            self._alone_until, self._tried_at = None, now
            self._set_threads(self.threads)
        self._seen = stalls
