"""The event-loop lag watch: a loop held by a blocking call shows as one late wake-up, and is logged once."""

from __future__ import annotations

import asyncio
import logging
import time

from voicepipe.observability.loop_lag import watch_loop_lag

INTERVAL_S = 0.01


def hold(loop: asyncio.AbstractEventLoop, seconds: float) -> tuple[float, float]:
    """Block the loop, as a blocking call on it (or a thread keeping the GIL) would: (start, end) on its clock."""
    start = loop.time()
    time.sleep(seconds)
    return start, loop.time()


async def test_a_held_loop_shows_as_the_timers_lateness_and_is_logged_once_per_period(caplog):
    loop = asyncio.get_running_loop()
    wakes: list[tuple[float, float]] = []  # (when the watch reported, the lateness it reported)
    watching = asyncio.create_task(watch_loop_lag(lambda lag: wakes.append((loop.time(), lag)),
                                                  interval_s=INTERVAL_S, warn_s=0.5, warn_every_s=60.0))
    await asyncio.sleep(0.05)
    with caplog.at_level(logging.WARNING, logger="voicepipe.observability.loop_lag"):
        holds = [hold(loop, 1.0)]
        await asyncio.sleep(0.05)
        holds.append(hold(loop, 0.6))  # held again within the warning period: counted, not logged again
        await asyncio.sleep(0.05)
    watching.cancel()
    lags = []
    for start, end in holds:
        # The timer slept from its report before the hold to its report after it; it can have been due no later
        # than one interval after it went to sleep, so it ran at least the hold less that interval late, and at
        # most the time between the two reports less the interval.
        before = max(at for at, _ in wakes if at <= start)
        at, lag = min((at, lag) for at, lag in wakes if at >= end)
        assert (end - start) - INTERVAL_S <= lag <= (at - before) - INTERVAL_S + 1e-9
        lags.append(lag)
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 1 and f"ran {lags[0] * 1000:.0f} ms late" in warnings[0]
