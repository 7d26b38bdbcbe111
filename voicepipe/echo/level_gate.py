"""Double-talk detection by level: the caller's audio, after the canceller, is silenced where it is no louder than
the agent's echo could be at that moment, so quiet residual echo never reaches the VAD as speech, while a caller
who talks over the agent still does.

How loud the echo can be is the agent's reference around the echo's delay (the loudest 10 ms of it, so the room's
tail is covered) times the call's coupling: how much of the reference comes back. The coupling is measured, not
set: the 90th percentile of the levels of the caller's audio as it comes (before the canceller) against that
reference, over the recent frames where the reference sounded and the gate had not opened for the caller (below).
Not the median: the reference sounds around the echo's delay
in frames where its echo is all but silent (the gaps between words, and before the delay is known much of the
searched range), and in real calls those pulled a median 20 dB under the echo. Measured on `echo/simulate.py`'s echo
(delays 20-400 ms, -6 to -40 dB), the echo frames' 90th percentile is 1.7 dB under the echo level and the loudest
frame 2 dB over it; a caller as loud as the agent, talking over it, has a median of -4.5 dB. So the caller's audio
passes where, after the canceller, it is louder than that percentile plus `MARGIN_DB`: the loudest echo as it comes,
which is more than the canceller leaves once it has converged. The coupling is taken before the canceller, not
after it: in real calls the first few hundred ms of each reply came back nearly as loud as without a canceller (the
filter relearns as the reply's alignment moves by some ms), and a coupling measured after the canceller let those
through.

Around the echo's delay means from the shortest to the longest of the delay estimate's last readings: in a call the
estimate once jumped from 150 to 452 ms (spurious readings, since taken out of `delay.py`), and the echo at 150 ms
then came through the gate, which looked for it at 452 ms; readings still differ by up to 140 ms within a call
where the reference placed a stretch of a reply off from where it played. Before the delay is known the whole
searched range of delays counts (the echo is somewhere in it), and the coupling is measured only from the longest
searched delay after the agent's first sound on (before that, its echo may not have come yet). Until there is
history to measure, the threshold is its cap: a caller as loud as the agent's loudest audio passes; once the delay
is found, the history starts again and the threshold stays what it was until it fills (at the cap instead, a
caller talking over the agent just then was cut to "in the market, on" in CI).

Mid-reply, once the agent has talked `SETTLED_MS` without a pause, the canceller has caught up with that stretch:
the bar is then the lower of the above and the same percentile of what the canceller leaves in such stretches,
plus the margin (bench echo's grid: barge-ins stopped at -6 dB 0.29 -> 0.42 of them, at -10 dB 0.54 -> 0.83,
self-interruptions 19 -> 17).

Only echo may join the histories. Blocks passed while the gate is open are the caller's; so may be blocks it shut
that were near the bar (within `NEAR_BAR_DB` under it): a caller who spoke no louder than the bar. Counted as echo,
they raised the bar towards the caller's level, which then shut more of them, up to the cap: in `bench echo`'s calls
at -6 dB the settled bar stood at -11.6 dB (against the agent's loudest nearby audio) at a call's first barge-in and
at -1.7 at its third, and of the barge-ins of two full grids there 12 of 18 first ones stopped the agent, 4 of 16
third ones. So such a block joins them only where what came in over the last `COHERENCE_MS` correlates with the
agent's audio at the echo's delay (`_echo_like`): echo does, a caller's voice does not. Echo that comes back louder
still raises the bar.

The same coupling, once the delay is known, is the call's echo return loss (`erl_db`, in the call record's echo
figures): how much quieter the echo comes back, before the canceller, than the agent's loudest audio around it, over
the history's last 2 s of the agent's audio (the percentile, negated). On that simulated echo (20, 150 and 400 ms)
it reads about 2 dB over the echo's loss (8 dB for an echo at -6 dB, 22 at -20), 35 at -35 and, for an echo at -40
under the line's noise, 35-38 (the noise's). Before the delay is known it is None: the levels then stand against the
loudest audio over every delay searched, and a line with no echo at all read 47 dB, as if it had a faint one.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from voicepipe.echo.delay import MIN_REFERENCE_RMS, whitened_correlation
from voicepipe.echo.reference import FarEndReference

COUPLING_PERCENTILE = 90.0
MARGIN_DB = 4.0  # over that percentile of the coupling: the loudest echo frames as they come
# Before the delay is known, the reference's loudest audio over all the delays searched stands for the echo's: it
# spreads wider against the echo (measured: echo got through the VAD with MARGIN_DB alone, 20-400 ms, -6 to -30 dB).
UNALIGNED_MARGIN_DB = 8.0
CAP_DB = -3.0  # the threshold never asks more of a caller than this against the agent's loudest audio
FLOOR_DB = -60.0  # nor less: below it the caller's audio is never silenced (no echo to speak of)
HISTORY_S = 2.0  # the coupling of the last 2 s of frames with the agent sounding
# The echo may come this much before the estimated delay (the delay of a reply's first audio moves), even before the
# reference places it to play: at 20 ms of echo delay, where the reference's placement was late, the echo reached the
# VAD ahead of the window (bench echo: 14 of its 19 self-interruptions at 20 ms, 11 of them over WebRTC).
LEAD_MS = 60.0
TAIL_MS = 120.0  # and its room tail this long after it
BLOCK_MS = 10.0  # the reference's loudness is read in blocks of this length
# Once OPEN_AFTER blocks in a row pass, at the agent's first sound the last louder too than the echo that can come
# meanwhile (`_over_echo_to_come`), the caller's audio passes whole for this long after the last one that did: their
# speech's softer sounds under the agent reach the STT too. One or two loud blocks alone are as likely residual echo:
# in bench echo's Twilio and AudioSocket calls, traced, two blocks (40 ms) of it over the bar opened the hangover and
# the 200 ms it let through made the VAD start speech, a self-interruption; a caller's speech stays loud longer.
HANGOVER_MS = 200.0
OPEN_AFTER = 3
# Once the agent has talked this long without a pause of PAUSE_MS, the canceller has caught up with this stretch of
# its audio and what it leaves sets the bar (`_settled`): a caller over loud echo passes by what it takes out.
SETTLED_MS = 600.0
PAUSE_MS = 300.0
# A block shut as echo joins the histories only if it is echo. One under the bar by less than NEAR_BAR_DB may be the
# caller's voice instead, shut because they spoke no louder than the bar: it joins them only where what the canceller
# left over the last COHERENCE_MS is coherent with the agent's audio at the echo's delay (`_echo_like`).
NEAR_BAR_DB = 2 * MARGIN_DB
COHERENCE_MS = 240.0
# The GCC-PHAT peak (`delay.whitened_correlation`) over the mean of the searched lags, as the delay estimate reads
# it, from which that audio is echo. Offline (`echo/simulate.py`, -6 to -20 dB, each reply placed up to 10 ms off
# where it played), what the canceller let through of the echo alone read 12 (median), a caller talking over the
# agent 6.5, their 95th percentile 12.
ECHO_PEAK_RATIO = 10.0


class EchoLevelGate:
    """Silences the caller's audio that is no louder than the echo of `reference` could be (int16 at its rate)."""

    def __init__(self, reference: FarEndReference, min_lag: int, max_lag: int, frame: int) -> None:
        rate = reference.rate
        self.reference = reference
        self.min_lag, self.max_lag = min_lag, max_lag
        self._lead, self._tail = int(rate * LEAD_MS / 1000), int(rate * TAIL_MS / 1000)
        self._block = int(rate * BLOCK_MS / 1000)
        self._hangover = int(rate * HANGOVER_MS / 1000)
        self._levels: deque[float] = deque(maxlen=int(HISTORY_S * rate / frame))  # dB, raw input over reference
        self._first_sound: int | None = None  # input position of the first frame with the agent's audio about
        self._aligned = False  # the levels were taken at the echo's delay (before: over all the delays searched)
        self._before_aligned: float | None = None  # the threshold just before the delay was known
        self._settled: deque[float] = deque(maxlen=self._levels.maxlen)  # dB, after the canceller, settled stretches
        self._settled_after, self._pause = int(rate * SETTLED_MS / 1000), int(rate * PAUSE_MS / 1000)
        self._sounding_since: int | None = None  # where the agent's audio about started again (None: quiet now)
        self._quiet_since = 0
        self._loud_run = 0  # blocks in a row up to this one that passed by their level
        self._open_until = 0  # input position up to which the caller's audio passes whole (the hangover)
        self.openings = 0  # times the hangover opened while shut: for the caller's speech, or for echo it let through
        self.gated_samples = 0  # caller audio silenced as echo
        self._coherence = int(rate * COHERENCE_MS / 1000)
        self._taper = np.hanning(self._coherence).astype(np.float32)
        self._recent = np.zeros(0, np.float32)  # the last COHERENCE_MS of what came in (after the canceller)

    def threshold_db(self, aligned: bool = True) -> float:
        """How far under the agent's loudest nearby audio the caller's audio is taken for echo (`aligned`: with the
        echo's delay known)."""
        coupling = self._coupling_db()
        if coupling is None:  # the delay has just been found: as before until the history fills again
            return CAP_DB if self._before_aligned is None else self._before_aligned
        margin = MARGIN_DB if aligned else UNALIGNED_MARGIN_DB
        return float(np.clip(coupling + margin, FLOOR_DB, CAP_DB))

    def _threshold_now(self, settled: bool) -> float:
        """`threshold_db`, or in a settled stretch of the agent's talk the lower bar of what the canceller leaves."""
        threshold = self.threshold_db(self._aligned)
        if settled and len(self._settled) >= self._settled.maxlen // 4:
            left = float(np.percentile(self._settled, COUPLING_PERCENTILE)) + MARGIN_DB
            threshold = min(threshold, max(left, FLOOR_DB))
        return threshold

    @property
    def erl_db(self) -> float | None:
        """The echo return loss the coupling measures now (dB, the module docstring); None before the echo's delay
        is known or with too little history."""
        coupling = self._coupling_db()
        return None if coupling is None or not self._aligned else round(-coupling, 1)

    def _coupling_db(self) -> float | None:
        """The caller's level as it comes against the reference's (its percentile over the history, dB); None
        until a quarter of the history is there."""
        if len(self._levels) < self._levels.maxlen // 4:
            return None
        return float(np.percentile(self._levels, COUPLING_PERCENTILE))

    def process(self, block: np.ndarray, position: int, delays: tuple[int, int] | None,
                raw: np.ndarray | None = None) -> np.ndarray:
        """`block` (int16, after the canceller; `raw` before it, None: the same) heard at input position `position`;
        `delays` the echo's delays the estimate's readings span, in samples (None: not yet known). Returns it, or
        silence where it is echo."""
        self._recent = np.concatenate([self._recent, block.astype(np.float32) / 32768.0])[-self._coherence:]
        far = self._far_level(position, len(block), delays)
        if far is None:
            if self._sounding_since is not None:
                self._sounding_since, self._quiet_since = None, position
            return block
        if self._aligned != (delays is not None):  # levels against the whole range of delays sit lower: start again
            self._before_aligned = self.threshold_db(self._aligned) if delays is not None else None
            self._aligned = delays is not None
            self._levels.clear()
            self._settled.clear()
            self._sounding_since = position  # the canceller starts at the delay found: not settled before it has run
        if self._sounding_since is None:  # the agent again: after a pause, anew; after a gap between words, as before
            gap = self._first_sound is not None and position - self._quiet_since < self._pause
            self._sounding_since = position - self._settled_after if gap else position
        settled = self._aligned and position - self._sounding_since >= self._settled_after
        threshold = self._threshold_now(settled)
        level_db = _level_db(block, far)
        loud = level_db >= threshold
        onset = position - self._sounding_since < self._hangover  # the agent's first sound after a pause
        self._loud_run = self._loud_run + 1 if loud else 0
        if self._loud_run >= OPEN_AFTER and (not onset or self._over_echo_to_come(block, far, position, delays,
                                                                                  threshold)):
            self.openings += position >= self._open_until
            self._open_until = position + len(block) + self._hangover
        if self._first_sound is None:
            self._first_sound = position
        caller = position < self._open_until  # the caller talks: their level is not the echo's
        if not caller and (delays is not None or position - self._first_sound >= self.max_lag) and (
                delays is None or level_db < threshold - NEAR_BAR_DB or self._echo_like(position, len(block), delays)):
            self._levels.append(_level_db(block if raw is None else raw, far))
            if settled:
                self._settled.append(level_db)
        if loud or caller:
            return block
        self.gated_samples += len(block)
        return np.zeros_like(block)

    def _echo_like(self, position: int, count: int, delays: tuple[int, int]) -> bool:
        """Whether what came in over the last COHERENCE_MS, up to `position + count`, is the agent's echo: its
        correlation with the reference, whitened (GCC-PHAT), peaks at a lag around the echo's delays. A caller's
        voice does not correlate with the agent's audio at any lag."""
        n = self._coherence
        if len(self._recent) < n:
            return True
        low, high = delays[0] - self._lead, delays[1] + self._tail
        far = self.reference.window(position + count - n - high, n + high - low)
        corr = whitened_correlation(self._recent * self._taper, far, 1 << (len(far) + n).bit_length())
        searched = corr[(high - low) - np.arange(high - low + 1)]  # lag `low + i` at i
        return bool(np.max(searched) >= ECHO_PEAK_RATIO * np.mean(np.abs(searched)))

    def _over_echo_to_come(self, block: np.ndarray, far: float, position: int, delays: tuple[int, int] | None,
                           threshold: float) -> bool:
        """Whether `block` is also louder than the echo that can come while the hangover it opens lasts: asked at
        the agent's first sound after a pause. At a reply's first faint sound the line's noise stands loud against
        it, and the hangover it opened let the loud echo behind it through whole (bench echo, three calls at once:
        6 of 10 self-interruptions). Asked mid-reply too, a caller talking over loud echo had to beat the agent's
        loudest audio over 200 ms more as well, and a grid that asked it everywhere stopped 3 of 24 barge-ins at
        -6 dB (docs/benchmarks.md, "Under load")."""
        ahead = self._far_level(position, len(block) + self._hangover, delays)
        return _level_db(block, max(far, ahead or 0.0)) >= threshold

    def _far_level(self, position: int, count: int, delays: tuple[int, int] | None) -> float | None:
        """The loudest 10 ms of the reference (mean square) whose echo can fall in [position, position + count);
        None when it is below `MIN_REFERENCE_RMS` (the agent was silent)."""
        if delays is None:  # (`low` may be under 0: audio sent and not yet placed to play, which may play early)
            low, high = self.min_lag - self._lead, self.max_lag + self._tail
        else:
            low, high = delays[0] - self._lead, delays[1] + self._tail
        window = self.reference.window(position - high, count + high - low)
        blocks = len(window) // self._block
        if not blocks:
            return None
        level = float(np.max(np.mean(np.square(window[: blocks * self._block].reshape(blocks, -1)), axis=1)))
        return level if level >= MIN_REFERENCE_RMS**2 else None


def _level_db(block: np.ndarray, far: float) -> float:
    near = float(np.mean(np.square(block, dtype=np.float64))) / 32768.0**2
    return 10 * float(np.log10(max(near, 1e-12) / far))
