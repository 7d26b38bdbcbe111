"""The event-loop lag watch: a loop held by a blocking call shows as one late wake-up, and is logged once."""

from __future__ import annotations

import asyncio
import logging
import time

from voicepipe.observability.loop_lag import watch_loop_lag


async def test_a_held_loop_shows_as_the_timers_lateness_and_is_logged_once_per_period(caplog):
    lags: list[float] = []
    watching = asyncio.create_task(watch_loop_lag(lags.append, interval_s=0.01, warn_s=0.5, warn_every_s=60.0))
    await asyncio.sleep(0.05)
    free = len(lags)
    with caplog.at_level(logging.WARNING, logger="voicepipe.observability.loop_lag"):
        time.sleep(1.0)  # holds the loop, as a blocking call on it (or a thread keeping the GIL) would
        await asyncio.sleep(0.05)
        time.sleep(0.6)  # held again within the warning period: counted, not logged again
        await asyncio.sleep(0.05)
    watching.cancel()
    assert free >= 1
    held = [lag for lag in lags if lag >= 0.5]
    assert len(held) == 2
    assert 0.9 <= held[0] < 1.5 and 0.5 <= held[1] < 1.1
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 1 and "ran 1" in warnings[0] and "ms late" in warnings[0]
