"""Streaming Piper synthesis: text in (token by token), 20 ms frames out, each tagged with its origin.

One `Synthesizer` per process holds the voice (one ONNX session) and one worker thread. Each agent turn
opens a `SpeechStream`: `push_text` feeds the chunker, every clause it releases is queued for synthesis
(first clauses of any stream go before later clauses of others), and the audio comes back resampled to the
stream's rate and cut into frames. `cancel()` empties the stream at once: `read()` returns nothing more, so
at most the frame already handed out is played. Word boundaries come from Piper's phoneme alignments.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from voicepipe.audio import Framer, StreamResampler, float32_to_int16
from voicepipe.config import TTSSettings
from voicepipe.tts.alignment import speech_phonemes, word_spans
from voicepipe.tts.chunker import TextChunk, TextChunker
from voicepipe.tts.cursor import PlayoutCursor, SpeechOrigin, WordTiming
from voicepipe.tts.voice import load_aligned_voice

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class AudioFrame:
    samples: np.ndarray  # int16 mono, frame_ms long (the very last frame is zero-padded)
    sample_rate: int
    start_sample: int  # position in the stream's output
    origin: SpeechOrigin | None  # the clause whose audio starts this frame
    last: bool = False


@dataclass
class ClauseAudio:
    """One clause synthesized at the voice's rate, with word spans relative to its first sample."""

    audio: np.ndarray  # float32
    sample_rate: int
    words: list[tuple[str, int, int, int, int]]  # (word, char_start, char_end, sample_start, sample_end)
    seconds: float = 0.0  # synthesis time


class Synthesizer:
    """The process-wide Piper voice and its synthesis worker."""

    def __init__(self, voice, settings: TTSSettings | None = None) -> None:
        from piper.config import SynthesisConfig

        self.voice = voice
        self.settings = settings or TTSSettings()
        self.voice_rate = int(voice.config.sample_rate)
        self.syn_config = SynthesisConfig(length_scale=self.settings.length_scale)
        self._phoneme_counts: dict[str, int] = {}
        self._jobs: list[tuple[int, int, SpeechStream, TextChunk | None]] = []
        self._seq = itertools.count()
        self._turns = itertools.count()
        self._cond = threading.Condition()
        self._stop = False
        self.seconds_synthesized = 0.0
        self.seconds_audio = 0.0
        self._streams: weakref.WeakSet[SpeechStream] = weakref.WeakSet()  # every stream still in memory
        self._thread = threading.Thread(target=self._run, name="tts-worker", daemon=True)
        self._thread.start()

    @classmethod
    def load(cls, path: Path, settings: TTSSettings | None = None, use_cuda: bool = False) -> Synthesizer:
        settings = settings or TTSSettings()
        return cls(load_aligned_voice(path, use_cuda, settings.cpu_threads, settings.max_clause_chars), settings)

    def open_stream(self, sample_rate: int | None = None, turn: int | None = None) -> SpeechStream:
        rate = self.settings.output_sample_rate if sample_rate is None else sample_rate
        stream = SpeechStream(self, rate, next(self._turns) if turn is None else turn)
        self._streams.add(stream)
        return stream

    @property
    def streams_in_memory(self) -> int:
        """Streams not yet garbage collected: once their calls have ended (and after `gc.collect()`), a leak."""
        return len(self._streams)

    def synthesize_clause(self, text: str, char_offset: int = 0) -> ClauseAudio:
        """Synthesize one clause now, on the calling thread (the worker uses this too)."""
        start = time.perf_counter()
        audio, alignments = [], []
        for chunk in self.voice.synthesize(text, self.syn_config, include_alignments=True):
            audio.append(chunk.audio_float_array)
            if chunk.phoneme_alignments:
                alignments += [(a.phoneme, int(a.num_samples)) for a in chunk.phoneme_alignments]
            else:  # no alignments for this sentence: spread its samples evenly over its phonemes
                n = max(len(chunk.phonemes), 1)
                alignments += [(p, len(chunk.audio_float_array) // n) for p in chunk.phonemes]
        samples = np.concatenate(audio).astype(np.float32) if audio else np.zeros(0, np.float32)
        words = [(w, a + char_offset, b + char_offset, s, e)
                 for w, a, b, s, e in word_spans(text, alignments, self._count_phonemes)]
        seconds = time.perf_counter() - start
        self.seconds_synthesized += seconds
        self.seconds_audio += len(samples) / self.voice_rate
        return ClauseAudio(samples, self.voice_rate, words, seconds)

    def _count_phonemes(self, word: str) -> int:
        n = self._phoneme_counts.get(word)
        if n is None:
            n = sum(speech_phonemes(s) for s in self.voice.phonemize(word))
            if len(self._phoneme_counts) < 50000:
                self._phoneme_counts[word] = n
        return n

    def close(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def __enter__(self) -> Synthesizer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- the worker -------------------------------------------------------------------------------
    def _submit(self, stream: SpeechStream, chunk: TextChunk | None) -> None:
        """Queue a clause (or, with chunk None, the end of the stream). Earlier clause indexes go first."""
        with self._cond:
            if self._stop:
                raise RuntimeError("Synthesizer is closed")
            priority = chunk.index if chunk is not None else stream._clauses_submitted
            heapq.heappush(self._jobs, (priority, next(self._seq), stream, chunk))
            self._cond.notify()

    def _run(self) -> None:
        while True:
            stream = chunk = None  # no stream is held while the worker waits (an ended call's is freed at once)
            with self._cond:
                while not self._stop and not self._jobs:
                    self._cond.wait()
                if self._stop:
                    return
                _, _, stream, chunk = heapq.heappop(self._jobs)
            if stream.cancelled or stream.error is not None:
                continue
            with self._cond:
                full = chunk is not None and stream.queued_frames >= stream.max_frames
                if full or not stream._ready_for(chunk):
                    # Back-pressure (max_queued_s unread) or an earlier clause of this stream still queued:
                    # park the job with its stream, without holding up the other streams. The stream's
                    # next delivery or its reader's next read puts it back.
                    stream._parked.append((chunk.index if chunk is not None else stream._clauses_submitted, chunk))
                    continue
            try:
                if chunk is None:
                    stream._finish()
                else:
                    clause = self.synthesize_clause(chunk.text, chunk.start)
                    stream._deliver(chunk, clause)
            except Exception as exc:  # one bad clause must not stop speech for every call
                log.exception("TTS synthesis failed")
                stream._fail(exc)
            self._unpark(stream)

    def _unpark(self, stream: SpeechStream) -> None:
        with self._cond:
            if not stream._parked:
                return
            for priority, chunk in stream._parked:
                heapq.heappush(self._jobs, (priority, next(self._seq), stream, chunk))
            stream._parked.clear()
            self._cond.notify()


class SpeechStream:
    """One agent turn's speech. Feed text with `push_text`/`end_text`; take frames with `read`."""

    def __init__(self, synth: Synthesizer, sample_rate: int, turn: int) -> None:
        if not isinstance(sample_rate, int) or not 8000 <= sample_rate <= 48000:
            raise ValueError(f"TTS output rate must be an integer from 8000 to 48000 Hz, got {sample_rate!r}")
        s = synth.settings
        self.synth = synth
        self.sample_rate = sample_rate
        self.turn = turn
        self.chunker = TextChunker(s.min_clause_chars, s.max_clause_chars, s.first_chunk_words)
        self.cursor = PlayoutCursor()
        self.framer = Framer(sample_rate, s.frame_ms)
        self.frame_samples = self.framer.frame_size
        self._resampler = StreamResampler(synth.voice_rate, sample_rate, dtype=np.float32)
        self._frames: deque[AudioFrame] = deque()
        self._cond = threading.Condition()
        self._voice_pos = 0  # voice-rate samples synthesized so far
        self._out_pos = 0  # output samples framed so far
        self._clauses_submitted = 0
        self._next_index = 0  # next clause index to deliver
        self._ended = False
        self.done = False  # every frame has been produced
        self.cancelled = False
        self.error: Exception | None = None
        self._origin: SpeechOrigin | None = None
        self._parked: list[tuple[int, TextChunk | None]] = []  # jobs waiting for room or for their turn
        self.max_frames = max(1, round(s.max_queued_s * 1000 / s.frame_ms))
        self.first_audio_at: float | None = None
        self.created_at = time.perf_counter()

    # --- producer side (the caller) ---------------------------------------------------------------
    def push_text(self, text: str) -> list[TextChunk]:
        """Add LLM text; returns the clauses it released for synthesis."""
        if self.cancelled:
            return []
        if self._ended:
            raise RuntimeError("push_text after end_text")
        chunks = self.chunker.push(text)
        if not chunks and self._running_dry():
            chunks = self.chunker.cut_words()
        for chunk in chunks:
            self._clauses_submitted += 1
            self.synth._submit(self, chunk)
        return chunks

    def end_text(self) -> list[TextChunk]:
        """No more text: synthesize the rest, then end the stream."""
        if self._ended:
            return []
        chunks = [] if self.cancelled else self.chunker.flush()
        for chunk in chunks:
            self._clauses_submitted += 1
            self.synth._submit(self, chunk)
        self._ended = True
        self.synth._submit(self, None)
        return chunks

    def say(self, text: str) -> None:
        self.push_text(text)
        self.end_text()

    def cancel(self) -> None:
        """Stop now: queued frames are dropped and no more are produced (barge-in)."""
        with self._cond:
            self.cancelled = True
            self._frames.clear()
            self.done = True
            self._cond.notify_all()

    def _running_dry(self) -> bool:
        """The audio made so far is about to have been played (counting from the first audio, at real time) and
        no clause is being synthesized."""
        low_water_ms = self.synth.settings.low_water_ms
        if not low_water_ms or self.first_audio_at is None or self._next_index < self._clauses_submitted:
            return False
        ahead_s = self._out_pos / self.sample_rate - (time.perf_counter() - self.first_audio_at)
        return ahead_s * 1000 < low_water_ms

    # --- consumer side (the transport) ------------------------------------------------------------
    def read(self, timeout: float | None = None) -> AudioFrame | None:
        """The next frame; None once the stream is done or cancelled, or on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._frames and not self.done:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining)
            if self.cancelled or not self._frames:
                return None
            frame = self._frames.popleft()
            self._cond.notify_all()
        if self._parked and len(self._frames) < self.max_frames:
            self.synth._unpark(self)
        return frame

    def frames(self, timeout: float | None = 30.0):
        """Iterate over frames until the stream ends (or a read times out)."""
        while (frame := self.read(timeout)) is not None:
            yield frame

    @property
    def queued_frames(self) -> int:
        return len(self._frames)

    # --- worker side ------------------------------------------------------------------------------
    def _ready_for(self, chunk: TextChunk | None) -> bool:
        index = self._clauses_submitted if chunk is None else chunk.index
        return index == self._next_index

    def _deliver(self, chunk: TextChunk, clause: ClauseAudio) -> None:
        ratio = self.sample_rate / clause.sample_rate
        base_voice = self._voice_pos
        self._voice_pos += len(clause.audio)
        start = round(base_voice * ratio)
        end = round(self._voice_pos * ratio)
        words = tuple(WordTiming(w, a, b, round((base_voice + s) * ratio), round((base_voice + e) * ratio))
                      for w, a, b, s, e in clause.words)
        origin = SpeechOrigin(self.turn, chunk.index, chunk.text, chunk.start, chunk.end, start, end,
                              self.sample_rate, words)
        self.cursor.add(origin)
        out = self._resampler.process(clause.audio)
        self._emit(float32_to_int16(out), origin, last=False)
        self._next_index += 1

    def _finish(self) -> None:
        tail = float32_to_int16(self._resampler.flush())
        self._emit(tail, self._origin, last=True)

    def _emit(self, samples: np.ndarray, origin: SpeechOrigin | None, last: bool) -> None:
        frames = self.framer.push(samples)
        if last:
            frames += self.framer.flush(pad=True)
        with self._cond:
            if self.cancelled:
                return
            for i, data in enumerate(frames):
                frame_origin = origin if self._origin is None or self._out_pos >= origin.sample_start else \
                    self._origin
                self._frames.append(AudioFrame(data, self.sample_rate, self._out_pos, frame_origin,
                                               last and i == len(frames) - 1))
                self._out_pos += len(data)
                if self.first_audio_at is None:
                    self.first_audio_at = time.perf_counter()
            self._origin = origin
            if last:
                self.done = True
            self._cond.notify_all()

    def _fail(self, exc: Exception) -> None:
        with self._cond:
            self.error = exc
            self.done = True
            self._cond.notify_all()
