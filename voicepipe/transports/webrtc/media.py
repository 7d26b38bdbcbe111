"""WebRTC media for both ends of a call: received frames to mono int16, and the two outbound audio tracks.

- `MonoInput` turns whatever a received audio track delivers (Opus decodes to s16 stereo 48 kHz, often
  stereo even from a mono mic; G.711 to 8 kHz) into mono int16 at one fixed rate.
- `drain(track, sink)` reads a received track until it ends; every track must be read, or aiortc buffers
  its frames without bound, so video and extra audio tracks are drained with no sink.
- `PacedTrack` (the server's agent voice) paces 20 ms frames against the wall clock with rising pts and
  sends silence when it has nothing to say; `clear()` drops what is queued. Marks queued between the audio
  come back through `on_played` once `recv()` has returned the frame holding the audio before them: that
  frame is the playout cursor.
- `FedTrack` (the `voicepipe call` caller) sends the frames it is fed; whoever feeds it keeps the pace.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import logging
import time
from collections import deque
from collections.abc import Callable

import numpy as np
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError
from av import AudioFrame, AudioResampler

log = logging.getLogger(__name__)

RATE = 48000  # WebRTC audio runs at 48 kHz (Opus); both ends hand PCM over at this rate
FRAME_S = 0.02
MAX_BEHIND_S = 0.2  # a stalled loop may catch up this much in a burst; further behind, the clock restarts


def audio_frame(pcm: np.ndarray, rate: int, pts: int) -> AudioFrame:
    """An s16 mono `AudioFrame` holding `pcm`, stamped `pts` in 1/rate units."""
    frame = AudioFrame.from_ndarray(np.ascontiguousarray(pcm, dtype=np.int16).reshape(1, -1), format="s16",
                                    layout="mono")
    frame.sample_rate = rate
    frame.pts = pts
    frame.time_base = fractions.Fraction(1, rate)
    return frame


class MonoInput:
    """Received frames -> mono int16 at `rate`, channels averaged (one per received track: it keeps state).

    libswresample does it: any sample format and layout, and only a few samples of delay where the rate
    changes (soxr's streaming upsampler would hold back 8 kHz G.711 audio in bursts of ~130 ms)."""

    def __init__(self, rate: int = RATE) -> None:
        self.rate = rate
        self._resampler = AudioResampler(format="s16", layout="mono", rate=rate)

    def convert(self, frame: AudioFrame) -> np.ndarray:
        out = [f.to_ndarray()[0] for f in self._resampler.resample(frame)]
        if not out:
            return np.zeros(0, np.int16)
        return out[0] if len(out) == 1 else np.concatenate(out)


async def drain(track: MediaStreamTrack, sink: Callable[[np.ndarray], None] | None = None) -> None:
    """Read `track` until it ends; audio goes to `sink` (mono int16 at 48 kHz), anything else is dropped."""
    mono = MonoInput() if sink is not None and track.kind == "audio" else None
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        if mono is not None:
            samples = mono.convert(frame)
            if samples.size:
                sink(samples)


class PacedTrack(MediaStreamTrack):
    """The agent's voice: 20 ms frames at real time, silence when idle or held, marks echoed as frames go out."""

    kind = "audio"

    def __init__(self, on_played: Callable[[str], None], rate: int = RATE) -> None:
        super().__init__()
        self.rate = rate
        self.samples = int(rate * FRAME_S)
        self.on_played = on_played
        self._items: deque[np.ndarray | str] = deque()  # audio pieces and mark names, in order
        self._offset = 0  # samples of the head piece already sent
        self._start: float | None = None
        self._sent = 0  # frames returned
        self._held = False  # silence goes out; the queue waits
        self.clock = time.monotonic

    def push_audio(self, pcm: np.ndarray) -> None:
        if len(pcm):
            self._items.append(pcm)

    def push_mark(self, name: str) -> None:
        self._items.append(name)

    def clear(self) -> None:
        self._items.clear()
        self._offset = 0

    def hold(self, on: bool) -> None:
        self._held = on

    @property
    def queued_samples(self) -> int:
        return sum(len(i) for i in self._items if not isinstance(i, str)) - self._offset

    async def recv(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = self.clock()
        if self._start is None or now - (self._start + self._sent * FRAME_S) > MAX_BEHIND_S:
            self._start = now - self._sent * FRAME_S
        wait = self._start + self._sent * FRAME_S - now
        if wait > 0:
            await asyncio.sleep(wait)
        pcm, marks = self._take()
        frame = audio_frame(pcm, self.rate, self._sent * self.samples)
        self._sent += 1
        for name in marks:
            with contextlib.suppress(Exception):  # the call may be ending; the frame still goes out
                self.on_played(name)
        return frame

    def _take(self) -> tuple[np.ndarray, list[str]]:
        """The next frame's samples (silence-padded) and the marks whose audio it completes."""
        out = np.zeros(self.samples, np.int16)
        filled = 0
        marks: list[str] = []
        items = self._items
        while items and not self._held:
            head = items[0]
            if isinstance(head, str):
                marks.append(items.popleft())
                continue
            if filled == self.samples:
                break
            n = min(self.samples - filled, len(head) - self._offset)
            out[filled:filled + n] = head[self._offset:self._offset + n]
            filled += n
            self._offset += n
            if self._offset == len(head):
                items.popleft()
                self._offset = 0
        return out, marks


class FedTrack(MediaStreamTrack):
    """The caller's voice in `voicepipe call`: sends the 20 ms frames it is fed, as they come."""

    kind = "audio"
    MAX_QUEUED = 50  # one second; older frames are dropped if the connection stops reading

    def __init__(self, rate: int = RATE) -> None:
        super().__init__()
        self.rate = rate
        self._queue: asyncio.Queue[np.ndarray] = asyncio.Queue()
        self._pts = 0

    def feed(self, pcm: np.ndarray) -> None:
        if self._queue.qsize() >= self.MAX_QUEUED:
            self._queue.get_nowait()
        self._queue.put_nowait(pcm)

    async def recv(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        pcm = await self._queue.get()
        frame = audio_frame(pcm, self.rate, self._pts)
        self._pts += len(pcm)
        return frame
