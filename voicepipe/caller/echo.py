"""A caller whose microphone picks up the agent: a speakerphone, or the residue a carrier's echo canceller leaves.

`SpeakerEcho` is made only from what the caller received over the wire, as it played on the caller's clock: the
agent's audio comes back `delay_ms` later in the microphone, `level_db` below what played, as a direct path and
two weaker reflections. The microphone's own clock counts its frames, so a frame that goes out late still holds
what it would have picked up on time.
"""

from __future__ import annotations

import numpy as np

# (delay after the direct path in ms, amplitude against it): two weaker reflections, as a small room gives
REFLECTIONS = ((11.0, -0.5), (29.0, 0.3))


class SpeakerEcho:
    def __init__(self, rate: int, delay_ms: float = 150.0, level_db: float = -10.0) -> None:
        self.rate = rate
        taps = [(delay_ms, 1.0)] + [(delay_ms + ms, gain) for ms, gain in REFLECTIONS]
        direct = 10 ** (level_db / 20) / np.sqrt(sum(gain**2 for _, gain in taps))  # `level_db` in all
        self._taps = [(round(rate * ms / 1000), direct * gain) for ms, gain in taps]
        self._played = np.zeros(0, np.float32)  # what played, by the microphone's sample clock
        self._t0: float | None = None  # when the microphone's sample 0 was picked up
        self._sent = 0  # microphone samples sent

    def played(self, audio: np.ndarray, start: float) -> None:
        """The agent's `audio` (int16 at `rate`) started to play at `start` (the caller's clock)."""
        at = self._sample(start)
        end = at + len(audio)
        if end > len(self._played):
            self._played = np.concatenate([self._played, np.zeros(end - len(self._played), np.float32)])
        self._played[at:end] = audio

    def cleared(self, now: float) -> None:
        """The agent's audio stopped playing at `now`."""
        self._played = self._played[: self._sample(now)]

    def mix(self, frame: np.ndarray, now: float) -> np.ndarray:
        """The microphone's next `frame` (int16), sent at `now`, with the echo it picked up."""
        if self._t0 is None:
            self._t0 = now - len(frame) / self.rate  # the first frame was picked up over the 20 ms before it went
        start, self._sent = self._sent, self._sent + len(frame)
        echo = np.zeros(len(frame), np.float32)
        for delay, gain in self._taps:
            source = np.arange(start, start + len(frame)) - delay
            heard = (source >= 0) & (source < len(self._played))
            echo[heard] += gain * self._played[source[heard]]
        return np.clip(np.rint(frame + echo), -32768, 32767).astype(np.int16)

    def _sample(self, t: float) -> int:
        if self._t0 is None:  # agent audio before the microphone's first frame: its clock starts here
            self._t0 = t
        return max(0, round((t - self._t0) * self.rate))
