"""Pacing: the caller's audio goes out at real-time pace in 20 ms frames, as a phone line carries it: the queued
utterances, and silence between them. The pacer stamps each turn's send times as its audio goes out, and hands out
an utterance's key presses with the frame they fall in (`keys_due`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import numpy as np

from voicepipe.audio import resample
from voicepipe.caller.report import ClientTurn
from voicepipe.caller.utterances import Utterance

FRAME_S = 0.02


class Pacer:
    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.frame = int(rate * FRAME_S)
        self._queue: list[tuple[Utterance, ClientTurn]] = []  # at `rate`
        self._pos = 0  # samples of the first queued utterance already sent
        self.speaking: ClientTurn | None = None  # the turn whose utterance is going out, from its first voiced frame
        self.keys_due: list[str] = []  # the keys to press with the frame `next_frame` just returned

    @property
    def busy(self) -> bool:
        """Whether an utterance is still queued or going out."""
        return bool(self._queue)

    def speak(self, utt: Utterance, turn: ClientTurn) -> None:
        """Queue `utt` (any rate) to go out as `turn`, after what is queued already."""
        if utt.rate != self.rate:
            scale = self.rate / utt.rate
            utt = Utterance(resample(utt.audio, utt.rate, self.rate), self.rate, int(utt.voiced_start * scale),
                            int(utt.voiced_end * scale), tuple((int(at * scale), key) for at, key in utt.keys))
        self._queue.append((utt, turn))

    def next_frame(self, now: float) -> np.ndarray:
        """The 20 ms to send at `now`: the next piece of the queued speech, or silence."""
        self.keys_due = []
        if not self._queue:
            return np.zeros(self.frame, np.int16)
        utt, turn = self._queue[0]
        pos, end = self._pos, self._pos + self.frame
        self.keys_due = [key for at, key in utt.keys if pos <= at < end]
        if turn.audio_start is None:
            turn.audio_start = now
        if turn.speech_start is None and end > utt.voiced_start:
            turn.speech_start = now
            self.speaking = turn
        if turn.speech_end is None and end >= utt.voiced_end:
            turn.speech_end = now if utt.keypad_only else now + FRAME_S  # a key goes out at its frame's start
        self._pos = end
        if end >= len(utt.audio):
            self._queue.pop(0)
            self._pos = 0
            self.speaking = None
        chunk = utt.audio[pos:end]
        return chunk if len(chunk) == self.frame else np.concatenate([chunk, np.zeros(self.frame - len(chunk),
                                                                                      np.int16)])

    async def run(self, send: Callable[[np.ndarray], Awaitable[bool]], lag_ms: list[float]) -> None:
        """Hand `send` a frame every 20 ms of wall clock until it returns False, noting in `lag_ms` how late each
        went out against the real-time schedule (a late frame is followed at once, not skipped)."""
        t0 = time.monotonic()
        n = 0
        while await send(self.next_frame(time.monotonic())):
            lag_ms.append((time.monotonic() - t0 - n * FRAME_S) * 1000)
            n += 1
            delay = t0 + n * FRAME_S - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
