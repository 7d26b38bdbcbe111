"""The recorded run's echo in a recording's caller channel: where the agent's channel (its audio as the transport
sent it) comes back in the caller's, found by GCC-PHAT over the whole call.

`replay init` says so when it finds one, because a replay cannot treat that echo as echo: it is of the recorded
run's replies, at the moments they played then, and the replay's replies play at other moments and may differ
(docs/replay.md, "Echo").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_LAG_S = 1.0  # the agent's audio is recorded when sent: the echo comes its lead, the line and the room later
CLEAR_PEAK = 20.0  # the peak over the mean correlation at the lags searched, as echo/delay.py counts a reading


@dataclass
class RecordedEcho:
    delay_ms: float  # after the agent's channel
    level_db: float  # of the strongest path, against the agent's channel


def recorded_echo(caller: np.ndarray, agent: np.ndarray, rate: int) -> RecordedEcho | None:
    """The echo of `agent` in `caller` (int16, one timeline at `rate`), or None when none stands clear."""
    caller, agent = caller.astype(np.float64), agent[: len(caller)].astype(np.float64)
    if not caller.any() or not agent.any():
        return None
    size = 1 << (len(caller) + len(agent) - 1).bit_length()
    cross = np.fft.rfft(caller, size) * np.conj(np.fft.rfft(agent, size))
    corr = np.abs(np.fft.irfft(cross / np.maximum(np.abs(cross), 1e-12), size)[: int(MAX_LAG_S * rate)])
    lag = int(np.argmax(corr))
    if corr[lag] < CLEAR_PEAK * float(np.mean(corr)):
        return None
    source = agent[: len(caller) - lag]
    gain = float(np.dot(caller[lag:lag + len(source)], source) / max(float(np.dot(source, source)), 1.0))
    return RecordedEcho(round(1000 * lag / rate, 1), round(20 * float(np.log10(max(abs(gain), 1e-6))), 1))
