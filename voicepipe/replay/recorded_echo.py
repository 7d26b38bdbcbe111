"""The recorded run's echo in a recording's caller channel: where the agent's channel (its audio as the transport
sent it) comes back in the caller's, found by GCC-PHAT over the whole call (the cross-spectrum summed over 4 s
blocks, so a long call costs no more memory than a short one). Its level is each block's echo at its own lag
near the call's: the alignment moves by a few ms from one reply to the next, as the agent's audio waits to play.

`replay init` says so when it finds one, because a replay cannot treat that echo as echo: it is of the recorded
run's replies, at the moments they played then, and the replay's replies play at other moments and may differ
(docs/replay.md, "Echo").
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

MAX_LAG_S = 1.0  # the agent's audio is recorded when sent: the echo comes its lead, the line and the room later
CLEAR_PEAK = 20.0  # the peak over the mean correlation at the lags searched, as echo/delay.py counts a reading
BLOCK_S = 4.0
NEAR_S = 0.1  # how far a block's own alignment may be from the call's


@dataclass
class RecordedEcho:
    delay_ms: float  # after the agent's channel (its audio as sent)
    level_db: float  # the echo's direct path against the agent's channel


def recorded_echo(caller: np.ndarray, agent: np.ndarray, rate: int) -> RecordedEcho | None:
    """The echo of `agent` in `caller` (int16, one timeline at `rate`), or None when none stands clear."""
    size = _size(rate)
    cross = sum((spectrum for spectrum, _ in _blocks(caller, agent, rate)), np.zeros(size // 2 + 1, np.complex128))
    if not cross.any():
        return None
    corr = np.abs(np.fft.irfft(cross / np.maximum(np.abs(cross), 1e-12), size)[: int(MAX_LAG_S * rate)])
    lag = int(np.argmax(corr))
    if corr[lag] < CLEAR_PEAK * float(np.mean(corr)):
        return None
    near = slice(max(0, lag - int(NEAR_S * rate)), lag + int(NEAR_S * rate) + 1)
    echo = played = 0.0
    for spectrum, power in _blocks(caller, agent, rate):
        if power > 0:
            echo += float(np.max(np.abs(np.fft.irfft(spectrum, size)[near]))) ** 2 / power
            played += power
    return RecordedEcho(round(1000 * lag / rate, 1), round(10 * float(np.log10(max(echo / played, 1e-12))), 1))


def _size(rate: int) -> int:
    """The FFT size of a block against the caller's audio from it to MAX_LAG_S after it: the lags read (0 to
    MAX_LAG_S) wrap nothing around."""
    return 1 << (int(BLOCK_S * rate) + int(MAX_LAG_S * rate) - 1).bit_length()


def _blocks(caller: np.ndarray, agent: np.ndarray, rate: int) -> Iterator[tuple[np.ndarray, float]]:
    """Each block of the agent's channel: its cross-spectrum against the caller's (whose inverse at k is the sum of
    caller[n + k] * agent[n]), and its power."""
    block, max_lag, size = int(BLOCK_S * rate), int(MAX_LAG_S * rate), _size(rate)
    for start in range(0, min(len(caller), len(agent)), block):
        source = agent[start:start + block].astype(np.float64)
        heard = caller[start:start + block + max_lag].astype(np.float64)
        yield np.fft.rfft(heard, size) * np.conj(np.fft.rfft(source, size)), float(np.dot(source, source))
