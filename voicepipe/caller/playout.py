"""The local playout clock: the agent's audio plays on the caller's clock as a phone would play it, each piece
after the one before. A mark is due once the audio received before it has played; a clear drops what has not
played yet, and every pending mark is due at once (the providers answer a clear so). What played is recorded.

An RTP phone (a browser, a SIP phone) plays through an adaptive jitter buffer: audio that arrives late plays late
(the buffer ran dry), and the burst that follows drains back to the buffer's target level by playing faster
(WebRTC's NetEq "accelerates": it cuts pitch periods out of the speech). Without it, every late burst would add
its lateness to all of the reply that follows, for good; with it, a stall only delays the audio for a while.
`Playout(rate, level_s)` models that: once more than `DRAIN_FROM_S` is queued, each arriving frame plays
`ACCELERATE` shorter until no more than `level_s` is. Ordinary jitter is left alone, as NetEq's target level
follows it: aiortc's receiver hands frames over up to 50 ms apart (the queue 25 / 37 / 51 ms at p50 / p90 / p99 in
`bench echo`'s WebRTC calls), and a buffer that cut a frame whenever more than 40 ms was queued cut 4-6 % of them,
each a 5 ms step in the echo's alignment that the server's canceller had to learn again.
"""

from __future__ import annotations

import numpy as np

from voicepipe.audio import resample

RECORD_RATE = 16000
JITTER_TARGET_S = 0.04  # an RTP phone's jitter buffer level: two 20 ms packets
DRAIN_FROM_S = 0.1  # queued beyond ordinary jitter: a late burst, which the buffer drains back to its level
ACCELERATE = 0.25  # the share of a frame that a draining jitter buffer leaves out


class Playout:
    def __init__(self, rate: int, level_s: float | None = None) -> None:
        self.rate = rate
        self.level_s = level_s  # an adaptive jitter buffer's level (None: play everything received)
        self._draining = False
        self.play_end = 0.0  # client clock: when the audio received so far has played
        self.last_audio = 0.0  # client clock: when agent audio last arrived (0: never)
        self._marks: list[tuple[float, str]] = []  # (due, name)
        self._recorded: list[np.ndarray] = []  # at RECORD_RATE

    def play(self, audio: np.ndarray, now: float) -> tuple[float, np.ndarray]:
        """Play `audio` (at `rate`) after what is playing; returns when it starts and what of it plays."""
        start = max(self.play_end, now)
        if self.level_s is not None:
            queued = start - now
            self._draining = queued > (self.level_s if self._draining else DRAIN_FROM_S)
            if self._draining:
                audio = audio[: len(audio) - int(len(audio) * ACCELERATE)]
        self.play_end = start + len(audio) / self.rate
        self.last_audio = now
        self._recorded.append(resample(audio, self.rate, RECORD_RATE) if self.rate != RECORD_RATE else audio)
        return start, audio

    def mark(self, name: str) -> None:
        self._marks.append((self.play_end, name))

    def due_marks(self, now: float) -> list[str]:
        """The marks whose audio has played by `now`, in order; they are no longer pending."""
        due = [name for at, name in self._marks if at <= now]
        if due:
            self._marks = [m for m in self._marks if m[0] > now]
        return due

    def clear(self, now: float) -> list[str]:
        """Stop playing at `now` (the unplayed audio leaves the recording too); returns every pending mark."""
        self._drop_recorded(int(max(0.0, self.play_end - now) * RECORD_RATE))
        self.play_end = now
        pending, self._marks = [name for _, name in self._marks], []
        return pending

    def quiet(self, quiet_s: float, now: float) -> bool:
        """Whether everything received has played and nothing new came for `quiet_s`."""
        return self.play_end <= now and now - max(self.last_audio, self.play_end) >= quiet_s

    def recording(self) -> np.ndarray:
        """The agent's audio as played, at RECORD_RATE."""
        return np.concatenate(self._recorded) if self._recorded else np.zeros(0, np.int16)

    def _drop_recorded(self, samples: int) -> None:
        while samples > 0 and self._recorded:
            last = self._recorded[-1]
            if len(last) <= samples:
                self._recorded.pop()
                samples -= len(last)
            else:
                self._recorded[-1] = last[: len(last) - samples]
                samples = 0
