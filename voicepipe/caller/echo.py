"""A caller whose microphone picks up the agent: a speakerphone, or the residue a carrier's echo canceller leaves.

`SpeakerEcho` is made only from what the caller received over the wire, as it played on the caller's clock: the
agent's audio comes back in the microphone `delay_ms` later, `level_db` below what played, as a direct path and
two weaker reflections, or with `tail` through `echo.simulate`'s room (four reflections and a 120 ms decaying
diffuse tail: the echo benchmark's speakerphone). The microphone's own clock counts its frames, so a frame that
goes out late still holds what it would have picked up on time. The loudspeaker's clock
may run `skew` faster than the microphone's (0.001: 0.1 %, 10 ms over 10 s of a reply): a reply's audio plays back
to back on it, and only a gap in the reply (the queue ran dry) or a clear puts it back on time. With `line`, the
microphone's audio goes out as a phone line sends it: a -70 dBFS noise floor, clipping at half scale (`CLIP_LEVEL`:
the loudest echo-plus-voice peaks) and mu-law coding; `level_db=None` is that microphone and line without echo.
"""

from __future__ import annotations

import numpy as np

from voicepipe.audio.l16 import float32_to_int16, int16_to_float32
from voicepipe.echo.simulate import impulse_response, microphone

# (delay after the direct path in ms, amplitude against it): two weaker reflections, as a small room gives
REFLECTIONS = ((11.0, -0.5), (29.0, 0.3))
KEEP_S = 2.0  # what played is kept this far behind what the echo still needs before the buffer is trimmed


class SpeakerEcho:
    def __init__(self, rate: int, delay_ms: float = 150.0, level_db: float | None = -10.0, *, tail: bool = False,
                 skew: float = 0.0, line: bool = False, seed: int = 0) -> None:
        self.rate = rate
        self.skew = skew
        self.line = line
        self._lag = int(rate * delay_ms / 1000)  # the direct path, where `impulse_response` puts it
        room = impulse_response(rate, delay_ms, seed)[self._lag:] if tail else _reflections(rate)
        gain = 0.0 if level_db is None else 10 ** (level_db / 20) / np.sqrt(np.sum(room**2))  # `level_db` in all
        self._room = (gain * room).astype(np.float32)
        self._spectra: dict[int, np.ndarray] = {}  # FFT size -> the room's spectrum
        self._played = np.zeros(0, np.float32)  # what played, by the loudspeaker's sample clock, from `_base` on
        self._base = 0
        self._end = 0  # loudspeaker sample where what was received so far stops playing
        self._queued_until: float | None = None  # caller clock: when that is, by the caller's playout
        self._t0: float | None = None  # when the microphone's sample 0 was picked up
        self._sent = 0  # microphone samples sent

    def played(self, audio: np.ndarray, start: float) -> None:
        """The agent's `audio` (int16 at `rate`) started to play at `start` (the caller's clock)."""
        back_to_back = self._queued_until is not None and start - self._queued_until < 0.5 / self.rate
        at = self._end if back_to_back else self._speaker(start)
        self._store(at, int16_to_float32(audio))
        self._end = at + len(audio)
        self._queued_until = start + len(audio) / self.rate

    def cleared(self, now: float) -> None:
        """The agent's audio stopped playing at `now`."""
        cut = max(self._speaker(now), self._base)
        self._played[cut - self._base:] = 0.0
        self._end = min(self._end, cut)
        self._queued_until = now

    def mix(self, frame: np.ndarray, now: float) -> np.ndarray:
        """The microphone's next `frame` (int16), sent at `now`, with the echo it picked up."""
        if self._t0 is None:
            self._t0 = now - len(frame) / self.rate  # the first frame was picked up over the 20 ms before it went
        start, self._sent = self._sent, self._sent + len(frame)
        echo = self._echo(start, len(frame))
        near = int16_to_float32(frame)
        return float32_to_int16(microphone(echo, near, seed=start) if self.line else near + echo)

    def _echo(self, start: int, count: int) -> np.ndarray:
        """The echo in microphone samples `start`..`start + count`: the room's response to what played, read on the
        loudspeaker's clock where the microphone's samples fall on it."""
        at = (np.arange(start, start + count) - self._lag) * (1.0 + self.skew)  # loudspeaker samples (fractional)
        first, stop = int(np.floor(at[0])), int(np.floor(at[-1])) + 2
        taps = len(self._room)
        heard = self._segment(first - taps + 1, stop)
        self._trim(first - taps + 1)
        if not heard.any():
            return np.zeros(count, np.float32)
        size = 1 << (len(heard) - 1).bit_length()
        if size not in self._spectra:
            self._spectra[size] = np.fft.rfft(self._room, size)
        echo = np.fft.irfft(np.fft.rfft(heard, size) * self._spectra[size], size)[taps - 1:len(heard)]
        return np.interp(at, np.arange(first, stop), echo).astype(np.float32)

    def _segment(self, begin: int, end: int) -> np.ndarray:
        """What played at loudspeaker samples `begin`..`end` (silence where nothing did)."""
        out = np.zeros(end - begin, np.float32)
        lo, hi = max(begin, self._base), min(end, self._base + len(self._played))
        if lo < hi:
            out[lo - begin:hi - begin] = self._played[lo - self._base:hi - self._base]
        return out

    def _store(self, at: int, audio: np.ndarray) -> None:
        end = at + len(audio) - self._base
        if end > len(self._played):
            grown = np.zeros(max(end, 2 * len(self._played)), np.float32)
            grown[:len(self._played)] = self._played
            self._played = grown
        lo = max(at, self._base)
        self._played[lo - self._base:end] = audio[lo - at:]

    def _trim(self, needed_from: int) -> None:
        drop = needed_from - self._base - int(KEEP_S * self.rate)
        if drop > 0:
            self._played = self._played[drop:].copy()
            self._base += drop

    def _speaker(self, t: float) -> int:
        """The loudspeaker's sample at caller-clock time `t`."""
        if self._t0 is None:  # agent audio before the microphone's first frame: its clock starts here
            self._t0 = t
        return max(0, round((t - self._t0) * self.rate * (1.0 + self.skew)))


def _reflections(rate: int) -> np.ndarray:
    """The direct path and `REFLECTIONS`, as an impulse response from the direct path on."""
    room = np.zeros(round(rate * REFLECTIONS[-1][0] / 1000) + 1, np.float32)
    room[0] = 1.0
    for ms, gain in REFLECTIONS:
        room[round(rate * ms / 1000)] = gain
    return room
