"""How late the event loop runs: the lateness of a timer that should fire every ``interval_s``.

Every call's inbound audio, end-of-turn decision and outbound frames wait on the one event loop. When something
holds it (a blocking call on the loop, or a native kernel on another thread that keeps the GIL), every call's
turn-taking is late by as much, yet no per-turn stage shows it as its own. The timer shows it: its lateness goes
to ``voicepipe_event_loop_lag_seconds`` (the server runs the watch from when its models are loaded), and a
lateness of ``warn_s`` or more is logged (at most once per ``warn_every_s``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

INTERVAL_S = 0.1


async def watch_loop_lag(observe: Callable[[float], None], interval_s: float = INTERVAL_S, warn_s: float = 0.25,
                         warn_every_s: float = 10.0) -> None:
    """Sleep ``interval_s`` at a time until cancelled and ``observe`` each wake-up's lateness, in seconds."""
    loop = asyncio.get_running_loop()
    last_warning = -warn_every_s
    while True:
        asleep = loop.time()
        await asyncio.sleep(interval_s)
        woke = loop.time()
        lag = max(0.0, woke - asleep - interval_s)
        observe(lag)
        if lag >= warn_s and woke - last_warning >= warn_every_s:
            last_warning = woke
            log.warning("the event loop ran %.0f ms late: every call's audio waited as long (a blocking call on "
                        "the loop, or a thread holding the GIL)", lag * 1000.0)
