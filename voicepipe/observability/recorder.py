"""Call recordings: a stereo WAV (caller left, agent right, as the caller heard it) and an events JSONL file.

`recordings_dir/<call_id>/call.wav` is 16-bit PCM at 16 kHz; sample 0 is the call's start. Caller audio is laid
down as it arrived; agent audio at the time the transport sent it, and what a clear cut off before the caller
heard it is removed. `events.jsonl` holds one JSON object per line: first `call_start` (transport, prompt,
greeting, metadata), then every call event (`inbound` frames, `vad`, `stt_*`, `llm_queued`, `first_token`,
`agent_text`, `agent_audio`, `mark`, `clear`, `barge_in`, `turn_decision`, `turn_reopened`, `dtmf`, `keypad`,
`tool_call`, `tool_result`, `turn`), last `call_end`: every event the call reports, as it comes. The replay room
reads this (a case's `[[dtmf]]` keys come from the `dtmf` events).

Both files are written incrementally by one writer thread, so the event loop never waits on the disk: the WAV's
header is rewritten after every append, so a crash leaves a valid file up to the last write (at most about
`HOLD_BACK_S` + one flush behind), and a call that ends abruptly is closed like any other.
"""

from __future__ import annotations

import json
import logging
import queue
import re
import struct
import threading
from pathlib import Path
from typing import Any

import numpy as np

from voicepipe.audio import StreamResampler

log = logging.getLogger(__name__)

RATE = 16000
HOLD_BACK_S = 0.5  # agent audio is sent up to max_lead ahead of playout; a clear may still cut it
FLUSH_EVERY_S = 0.25
MAX_CALLER_JITTER_S = 0.1  # caller audio arriving later than this after the previous chunk leaves a gap
_SAFE_ID = re.compile(r"[^A-Za-z0-9._-]")


def recording_dir(recordings_dir: Path, call_id: str) -> Path:
    """Where a call's recording lives (the call id made safe as a directory name)."""
    name = _SAFE_ID.sub("_", call_id)[:120].lstrip(".") or "call"
    return Path(recordings_dir) / name


def _wants_recording(metadata: dict[str, Any], default: bool) -> bool:
    value = metadata.get("record")
    if value is None:
        return default
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


class CallRecorder:
    """A `CallObserver` that records the calls it is asked to (all, or those whose `record` parameter is set)."""

    def __init__(self, recordings_dir: Path, record_all: bool = False) -> None:
        self.recordings_dir = Path(recordings_dir)
        self.record_all = record_all
        self._open: dict[str, _Recording] = {}
        self._writer = _Writer()

    def call_started(self, call) -> None:
        if not _wants_recording(call.metadata, self.record_all):
            return
        rec = _Recording(recording_dir(self.recordings_dir, call.call_id), self._writer)
        self._open[call.call_id] = rec
        rec.event({"t": 0.0, "type": "call_start", "call_id": call.call_id, "transport": call.transport,
                   "started": call.started, "sample_rate": RATE, "system_prompt": call.system_prompt,
                   "greeting": call.greeting, "metadata": call.metadata})
        log.info("call %s: recording to %s", call.call_id, rec.directory)

    def event(self, call, event: dict[str, Any]) -> None:
        rec = self._open.get(call.call_id)
        if rec is not None:
            rec.event(event)
            if event["type"] == "clear":
                rec.clear_agent(event["t"])

    def audio(self, call, channel: str, samples: np.ndarray, rate: int, t: float) -> None:
        rec = self._open.get(call.call_id)
        if rec is not None:
            rec.audio(channel, samples, rate, t)

    def turn_finished(self, call, turn) -> None:
        pass  # the session's own "turn" event carries the finished turn into events.jsonl

    def call_ended(self, call) -> None:
        rec = self._open.pop(call.call_id, None)
        if rec is not None:
            end = round(max(rec.latest_t, 0.0), 4)
            rec.event({"t": end, "type": "call_end", "reason": call.end_reason, "outcome": call.outcome})
            rec.close()

    def close(self) -> None:
        """Close every open recording and stop the writer (the app's shutdown)."""
        for rec in list(self._open.values()):
            rec.close()
        self._open.clear()
        self._writer.stop()


class _Recording:
    """One call's recording: mixes the two channels on the event loop, hands bytes to the writer."""

    def __init__(self, directory: Path, writer: _Writer) -> None:
        self.directory = directory
        self._writer = writer
        self._pending = np.zeros((0, 2), np.int16)  # frames from `_written` on, not yet handed to the writer
        self._written = 0
        self._caller_end = 0  # next free caller position
        self._agent_end = 0
        self._resamplers: dict[str, StreamResampler] = {}  # per channel, for audio not at RATE
        self._last_flush_t = 0.0
        self.latest_t = 0.0
        writer.put(self, "open", None)

    def event(self, event: dict[str, Any]) -> None:
        self.latest_t = max(self.latest_t, float(event.get("t", 0.0)))
        self._writer.put(self, "event", json.dumps(event, default=str, ensure_ascii=False) + "\n")

    def audio(self, channel: str, samples: np.ndarray, rate: int, t: float) -> None:
        self.latest_t = max(self.latest_t, t)
        audio = self._at_rate(channel, samples, rate)
        if channel == "caller":
            arrived_at = round(t * RATE) - len(audio)  # the chunk ends when it arrived
            late = arrived_at - self._caller_end > MAX_CALLER_JITTER_S * RATE
            pos = arrived_at if late else self._caller_end
            self._place(0, pos, audio)
            self._caller_end = pos + len(audio)
        else:
            pos = max(self._agent_end, round(t * RATE))
            self._place(1, pos, audio)
            self._agent_end = pos + len(audio)
        if t - self._last_flush_t >= FLUSH_EVERY_S:
            self._last_flush_t = t
            self._flush(round((t - HOLD_BACK_S) * RATE))

    def _at_rate(self, channel: str, samples: np.ndarray, rate: int) -> np.ndarray:
        if rate == RATE:
            return samples
        known = self._resamplers.get(channel)
        if known is None or known.in_rate != rate:
            known = self._resamplers[channel] = StreamResampler(rate, RATE)
        return known.process(samples)

    def clear_agent(self, t: float) -> None:
        """The transport cleared the caller's buffer at `t`: agent audio placed after it was never heard."""
        cut = max(0, round(t * RATE) - self._written)
        if cut < len(self._pending):
            self._pending[cut:, 1] = 0
        self._agent_end = min(self._agent_end, round(t * RATE))

    def close(self) -> None:
        self._flush(self._written + len(self._pending))
        self._writer.put(self, "close", None)

    def _place(self, channel: int, pos: int, audio: np.ndarray) -> None:
        start = pos - self._written
        if start < 0:  # already written out: keep only the part still pending
            audio = audio[-start:]
            start = 0
        end = start + len(audio)
        if end > len(self._pending):
            grown = np.zeros((end, 2), np.int16)
            grown[: len(self._pending)] = self._pending
            self._pending = grown
        self._pending[start:end, channel] = audio

    def _flush(self, upto: int) -> None:
        n = upto - self._written
        if n <= 0:
            return
        frames = np.zeros((n, 2), np.int16)
        have = min(n, len(self._pending))
        frames[:have] = self._pending[:have]
        self._pending = self._pending[have:]
        self._written = upto
        self._writer.put(self, "audio", frames.astype("<i2").tobytes())


class _Writer:
    """One thread that does every recording's file work, in order, flushing after each batch."""

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def put(self, rec: _Recording, op: str, payload: Any) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="call-recorder", daemon=True)
                self._thread.start()
        self._queue.put((rec, op, payload))

    def stop(self, timeout: float = 10.0) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout)

    def _run(self) -> None:
        files: dict[int, _Files] = {}
        while True:
            batch = [self._queue.get()]
            while not self._queue.empty():
                batch.append(self._queue.get_nowait())
            touched: set[int] = set()
            for item in batch:
                if item is None:
                    for f in files.values():
                        f.close()
                    return
                rec, op, payload = item
                key = id(rec)
                try:
                    if op == "open":
                        files[key] = _Files(rec.directory)
                    elif key in files:
                        f = files[key]
                        if op == "event":
                            f.events.write(payload)
                        elif op == "audio":
                            f.append_audio(payload)
                        elif op == "close":
                            files.pop(key).close()
                            continue
                        touched.add(key)
                except OSError as exc:  # a full disk must not take the calls down; drop this recording
                    log.error("recording %s failed: %s", rec.directory, exc)
                    broken = files.pop(key, None)
                    if broken is not None:
                        broken.close()
            for key in touched:
                if key in files:
                    files[key].flush()


class _Files:
    """The open files of one recording; the WAV header is kept valid after every append."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.events = open(directory / "events.jsonl", "w", encoding="utf-8")  # noqa: SIM115 (closed in close())
        self.wav = open(directory / "call.wav", "wb")  # noqa: SIM115
        self.data_bytes = 0
        self.wav.write(_wav_header(0))

    def append_audio(self, data: bytes) -> None:
        self.wav.seek(0, 2)
        self.wav.write(data)
        self.data_bytes += len(data)

    def flush(self) -> None:
        self.wav.seek(0)
        self.wav.write(_wav_header(self.data_bytes))
        self.wav.flush()
        self.events.flush()

    def close(self) -> None:
        self.flush()
        self.wav.close()
        self.events.close()


def _wav_header(data_bytes: int) -> bytes:
    channels, width = 2, 2
    return (b"RIFF" + struct.pack("<I", 36 + data_bytes) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, RATE, RATE * channels * width, channels * width,
                                    width * 8)
            + b"data" + struct.pack("<I", data_bytes))
