"""Streaming transcription: one worker thread and one model serve every call's `TranscriptStream`.

While the caller speaks, each stream asks for a partial every `partial_interval_ms` of audio. The worker
re-decodes the utterance up to where the request was made (without whisper's 30 s padding) and LocalAgreement
commits the words two successive decodes agree on. At the end of the turn, `finish()` queues the final, which goes
before every partial.

A final's text is a function of the audio alone, never of how fast the worker ran: it decodes the utterance up to
a position the audio sets (`final_end`): the latest partial request's position when that one covers the end of
speech (`end_sample`, from the VAD), else the end of speech itself. Partials are asked for at positions the
audio sets (every `partial_interval_ms` of speech, and once `PAUSE_MS` into each pause), so when the pause's
partial has already been decoded the final reuses it at once (no model run, no wait behind the worker's current
job); otherwise the same audio is decoded for it. Partial requests are coalesced per stream (a stream never has
two waiting) and dropped when they have waited longer than `stale_partial_ms`.

Callbacks run on the worker thread (or, for a final that is ready at once, on the thread that called
`finish`); keep them short (e.g. `loop.call_soon_threadsafe`).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field

import numpy as np

from voicepipe.audio import StreamResampler
from voicepipe.config import STTSettings
from voicepipe.stt.agreement import LocalAgreement, group_words
from voicepipe.stt.decoder import SAMPLE_RATE, DecodeResult, WhisperDecoder
from voicepipe.vad.samples import AudioInputError, check_rate, to_float32

log = logging.getLogger(__name__)


PAUSE_MS = 50  # after this much quiet audio following speech, a partial is asked for at once (well before the
# VAD reports the speech end, vad.min_silence_ms later: the final then reuses it)
PAUSE_RATIO = 0.1  # quiet: a chunk's RMS under this share of the caller's running peak


class STTOverloaded(RuntimeError):
    """The shared worker has `max_queue` finals waiting; the caller should retry or fail the turn."""


@dataclass(frozen=True)
class Transcript:
    text: str
    is_final: bool
    turn: int
    stable_text: str = ""  # words committed (partials); the whole text for a final
    audio_ms: float = 0.0  # audio of the turn the text covers
    decode_ms: float = 0.0  # model time spent on this result (0 when reused)
    reused: bool = False  # final taken from a decode made during speech


@dataclass
class _Turn:
    id: int
    capacity: int
    buffer: np.ndarray = field(init=False)
    n: int = 0
    start_input: int = 0  # stream input sample where this turn began
    segments: list[str] = field(default_factory=list)  # text of rolled-over 30 s segments
    pending_segments: int = 0
    rolled: int = 0  # 16 kHz samples already handed to segments
    agreement: LocalAgreement = field(default_factory=LocalAgreement)
    last: DecodeResult | None = None
    requested_at: int = 0  # samples at the last partial request: a partial decodes the audio up to here
    speech_from: int = 0  # samples of lead before the speech (`push_before_speech`): partials count from here
    loud: float = 0.0  # running peak of the chunk RMS (slowly decaying): how loud this caller's speech is
    quiet: int = 0  # samples since the audio last went above PAUSE_RATIO * loud
    pause_requested: bool = True  # a partial was already asked for in the current pause
    peeked: bool = False  # an early reply has this turn's transcript: no partials until the caller speaks again
    finished: bool = False

    def __post_init__(self) -> None:
        self.buffer = np.zeros(self.capacity, dtype=np.float32)

    def audio(self, upto: int | None = None) -> np.ndarray:
        return self.buffer[: self.n if upto is None else min(upto, self.n)].copy()


class TranscriptStream:
    """One call's transcription. `push` audio as it arrives, `finish` at the end of each turn."""

    def __init__(self, transcriber: Transcriber, stream_id: int, sample_rate: int, initial_prompt: str | None,
                 hotwords: str | None, on_partial: Callable[[Transcript], None] | None,
                 on_final: Callable[[Transcript], None] | None) -> None:
        self.transcriber = transcriber
        self.id = stream_id
        self.sample_rate = check_rate(sample_rate, what="STT input")
        self.on_partial = on_partial
        self.on_final = on_final
        self.context = transcriber.decoder.context_tokens(initial_prompt, hotwords)
        self._resampler = (None if self.sample_rate == SAMPLE_RATE
                           else StreamResampler(self.sample_rate, SAMPLE_RATE, dtype=np.float32))
        self._lock = threading.Lock()
        self._turn_ids = itertools.count()
        self.samples_pushed = 0  # input samples since the stream opened
        self.closed = False
        self._turn = self._new_turn()

    def _new_turn(self) -> _Turn:
        return _Turn(next(self._turn_ids), self.transcriber.max_samples, start_input=self.samples_pushed)

    @property
    def turn(self) -> int:
        return self._turn.id

    def set_prompt(self, initial_prompt: str | None = None, hotwords: str | None = None) -> None:
        """Bias the vocabulary of this call (e.g. business names); applies to the next decode."""
        self.context = self.transcriber.decoder.context_tokens(initial_prompt, hotwords)

    def push(self, samples: np.ndarray) -> None:
        """Add caller audio (int16 or float32, the stream's rate). Zero-length chunks are a no-op."""
        self._push(samples, speech=True)

    def push_before_speech(self, samples: np.ndarray) -> None:
        """Add the audio from before the VAD's speech start (a turn's lead, so decodes hear its first sound whole):
        like `push`, but the partials count their interval from its end. Counted as speech, a lead as long as the
        interval made the first partial one of the lead and a syllable, and whisper made "I'm" of "Okay" there (over
        the agent's reply, words that are no backchannel: the agent was cut)."""
        self._push(samples, speech=False)

    def _push(self, samples: np.ndarray, speech: bool) -> None:
        if self.closed:
            raise RuntimeError("TranscriptStream is closed")
        audio = to_float32(samples, "STT input")
        if audio.size == 0:
            return
        with self._lock:
            self.samples_pushed += len(audio)
            if self._resampler is not None:
                audio = self._resampler.process(audio)
            turn = self._turn
            self._append(turn, audio)
            # Speech just stopped: decode now, so the final is ready when the VAD says so. Otherwise every
            # partial_interval, on speech only: over silence nothing new was said (and an early reply is busy
            # then), and a decode started in the quiet before a pause would hold up the pause's own decode.
            if not speech:
                turn.speech_from = turn.n
            since = turn.n - max(turn.requested_at, turn.speech_from)
            pause = self._pause_began(turn, audio)
            due = speech and not turn.peeked and (pause or (since >= self.transcriber.partial_samples
                                                            and turn.quiet == 0))
            if due and len(audio):
                turn.requested_at = turn.n
        if due:
            self.transcriber._request_partial(self)

    @staticmethod
    def _pause_began(turn: _Turn, audio: np.ndarray) -> bool:
        """True once per pause: the audio has been quiet for PAUSE_MS after being loud."""
        if not len(audio):
            return False
        rms = float(np.sqrt(np.mean(np.square(audio))))
        turn.loud = max(rms, turn.loud * 0.998)
        if rms >= PAUSE_RATIO * turn.loud and rms >= 1e-3:
            turn.quiet = 0
            turn.pause_requested = False
            return False
        turn.quiet += len(audio)
        if not turn.pause_requested and turn.quiet >= PAUSE_MS * SAMPLE_RATE // 1000:
            turn.pause_requested = True
            return True
        return False

    def _append(self, turn: _Turn, audio: np.ndarray) -> None:
        while len(audio):
            take = min(turn.capacity - turn.n, len(audio))
            turn.buffer[turn.n: turn.n + take] = audio[:take]
            turn.n += take
            audio = audio[take:]
            if turn.n == turn.capacity:
                self._roll_segment(turn)

    def _roll_segment(self, turn: _Turn) -> None:
        """The turn outgrew the window: decode the full window as a segment and start a fresh one."""
        audio = turn.audio()
        index = len(turn.segments)
        turn.segments.append("")
        turn.pending_segments += 1
        turn.rolled += turn.n
        turn.n = 0
        turn.requested_at = turn.speech_from = 0
        turn.last = None
        turn.agreement.reset()
        self.transcriber._submit_segment(self, turn, index, audio)

    def finish(self, end_sample: int | None = None) -> Future[Transcript]:
        """End the turn: returns a future of the final transcript; the stream is ready for the next turn.

        `end_sample` (input samples since the stream opened, e.g. the VAD's speech_end sample) marks where
        speech ended; audio after it is silence and is not transcribed.
        """
        with self._lock:
            turn = self._turn
            if self._resampler is not None:  # the resampler's filter still holds the last few ms
                self._append(turn, self._resampler.flush())
            turn.finished = True
            end = self._turn_end(turn, end_sample)
            self._turn = self._new_turn()
        return self.transcriber._submit_final(self, turn, end)

    def peek(self, end_sample: int | None = None) -> Future[Transcript]:
        """The transcript of the current turn up to `end_sample`, as `finish` would give it, but the turn goes on:
        the caller may resume, and a later `finish` covers all of it. (A call starts its reply early with this.)
        No `on_final` callback; `final` is True because the text is final for the audio up to `end_sample`.
        Until `resume()`, the turn asks for no partials: the caller said nothing new, and a decode then would take
        the cores from the reply's LLM prefill (a pause partial can fall due just after the VAD's speech end)."""
        with self._lock:
            turn = self._turn
            turn.peeked = True
            end = self._turn_end(turn, end_sample)
        return self.transcriber._submit_final(self, turn, end, peek=True)

    def resume(self) -> None:
        """The caller speaks again after a `peek`: partials resume."""
        with self._lock:
            self._turn.peeked = False

    def _turn_end(self, turn: _Turn, end_sample: int | None) -> int:
        """`end_sample` (stream input samples) as an index into the turn's 16 kHz buffer."""
        if end_sample is None:
            return turn.n
        local = round((end_sample - turn.start_input) * SAMPLE_RATE / self.sample_rate) - turn.rolled
        return max(0, min(turn.n, local))

    def cancel_turn(self) -> None:
        """Drop the current turn without a final (e.g. the VAD's speech was a false start)."""
        with self._lock:
            self._turn.finished = True
            self._turn = self._new_turn()

    def close(self) -> None:
        self.cancel_turn()
        self.closed = True
        self.transcriber._forget(self)


@dataclass
class _FinalJob:
    stream: TranscriptStream | None
    turn: _Turn | None
    end: int  # the turn's audio up to here is decoded (`final_end`)
    future: Future
    speech_end: int = 0  # the end of speech the final was asked for (`end` when it decodes up to there)
    audio: np.ndarray | None = None  # for segments and one-shot transcriptions
    segment: int | None = None
    context: list[int] = field(default_factory=list)
    submitted: float = field(default_factory=time.perf_counter)
    peek: bool = False  # the turn goes on (TranscriptStream.peek): no on_final, not counted as a final


@dataclass
class TranscriberStats:
    partials_done: int = 0
    partials_dropped: int = 0
    finals_done: int = 0
    finals_reused: int = 0
    finals_empty: int = 0  # finals of at least EMPTY_FINAL_WARN_S of speech that gave no words
    decode_seconds: float = 0.0
    audio_seconds: float = 0.0


class Transcriber:
    """The process-wide STT worker: one model, one thread, every call's streams."""

    def __init__(self, model, settings: STTSettings | None = None, max_batch: int = 4,
                 decoder: WhisperDecoder | None = None) -> None:
        self.settings = s = settings or STTSettings()
        self.decoder = decoder or WhisperDecoder(model, s.language, s.beam_size)
        self.partial_samples = round(s.partial_interval_ms * SAMPLE_RATE / 1000)
        self.max_samples = round(min(s.max_utterance_s, 30.0) * SAMPLE_RATE)
        self.max_batch = max_batch
        self.stats = TranscriberStats()
        self._ids = itertools.count()
        self._finals: deque[_FinalJob] = deque()
        self._partials: OrderedDict[int, tuple[TranscriptStream, float]] = OrderedDict()
        self._cond = threading.Condition()
        self._stop = False
        self._streams: weakref.WeakSet[TranscriptStream] = weakref.WeakSet()  # every stream still in memory
        self._thread = threading.Thread(target=self._run, name="stt-worker", daemon=True)
        self._thread.start()

    @classmethod
    def load(cls, path, settings: STTSettings | None = None, device: str = "cpu", compute_type: str = "int8"):
        from voicepipe.stt.model import load_whisper

        s = settings or STTSettings()
        return cls(load_whisper(path, device, compute_type, s.cpu_threads), s)

    # --- public API -------------------------------------------------------------------------------
    def open_stream(self, sample_rate: int = 16000, initial_prompt: str | None = None, hotwords: str | None = None,
                    on_partial: Callable[[Transcript], None] | None = None,
                    on_final: Callable[[Transcript], None] | None = None) -> TranscriptStream:
        prompt = initial_prompt if initial_prompt is not None else self.settings.initial_prompt
        words = hotwords if hotwords is not None else self.settings.hotwords
        stream = TranscriptStream(self, next(self._ids), sample_rate, prompt, words, on_partial, on_final)
        self._streams.add(stream)
        return stream

    @property
    def streams_in_memory(self) -> int:
        """Streams not yet garbage collected: once their calls have ended (and after `gc.collect()`), a leak."""
        return len(self._streams)

    def transcribe(self, samples: np.ndarray, sample_rate: int = 16000, initial_prompt: str | None = None,
                   hotwords: str | None = None, timeout: float | None = None) -> Transcript:
        """Whole-utterance transcription through the same worker (final priority); blocks until done."""
        return self.submit_transcribe(samples, sample_rate, initial_prompt, hotwords).result(timeout)

    def submit_transcribe(self, samples: np.ndarray, sample_rate: int = 16000, initial_prompt: str | None = None,
                          hotwords: str | None = None) -> Future[Transcript]:
        audio = to_float32(samples, "STT input")
        rate = check_rate(sample_rate, what="STT input")
        if rate != SAMPLE_RATE and audio.size:
            from voicepipe.audio import resample

            audio = resample(audio, rate, SAMPLE_RATE)
        context = self.decoder.context_tokens(initial_prompt, hotwords)
        job = _FinalJob(None, None, len(audio), Future(), audio=audio, context=context)
        self._enqueue_final(job)
        return job.future

    def close(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def __enter__(self) -> Transcriber:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- queueing ---------------------------------------------------------------------------------
    def _request_partial(self, stream: TranscriptStream) -> None:
        with self._cond:
            if stream.id in self._partials:
                self.stats.partials_dropped += 1  # coalesced: the waiting request will read the newer audio
                return
            self._partials[stream.id] = (stream, time.perf_counter())
            self._cond.notify()

    def _forget(self, stream: TranscriptStream) -> None:
        with self._cond:
            self._partials.pop(stream.id, None)

    def _enqueue_final(self, job: _FinalJob) -> None:
        with self._cond:
            if self._stop:
                raise RuntimeError("Transcriber is closed")
            if len(self._finals) >= self.settings.max_queue:
                job.future.set_exception(STTOverloaded(
                    f"STT worker has {len(self._finals)} finals waiting (stt.max_queue)"))
                return
            self._finals.append(job)
            self._cond.notify()

    def _submit_final(self, stream: TranscriptStream, turn: _Turn, end: int, peek: bool = False) -> Future[Transcript]:
        job = _FinalJob(stream, turn, final_end(turn, end), Future(), speech_end=end, context=stream.context,
                        peek=peek)
        # Fast path: the decode this final needs was made during speech, so the final is ready now, without
        # waiting behind the job the worker is running.
        if turn.pending_segments == 0 and self._reusable(turn, job.end) is not None:
            with self._cond:
                self._finish_turn(job)
            return job.future
        self._enqueue_final(job)
        return job.future

    @staticmethod
    def _reusable(turn: _Turn, end: int) -> DecodeResult | None:
        """The partial decode of exactly `turn`'s audio up to `end`, if it was made and found words."""
        last = turn.last
        if last is not None and end > 0 and last.samples == end and last.text.strip():
            return last
        return None

    def _submit_segment(self, stream: TranscriptStream, turn: _Turn, index: int, audio: np.ndarray) -> None:
        job = _FinalJob(stream, turn, len(audio), Future(), audio=audio, segment=index, context=stream.context)
        self._enqueue_final(job)
        if job.future.done() and job.future.exception() is not None:
            turn.pending_segments -= 1  # overloaded: this segment's words are lost; say so
            log.warning("STT overloaded: dropped a 30 s segment of stream %d", stream.id)

    # --- the worker -------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            final = partials = None  # no stream is held while the worker waits (an ended call's is freed at once)
            with self._cond:
                while not self._stop and not self._finals and not self._partials:
                    self._cond.wait()
                if self._stop:
                    for job in self._finals:
                        job.future.cancel()
                    return
                if self._finals:
                    final, partials = self._finals.popleft(), []
                else:
                    final, partials = None, self._take_partials()
            try:
                if final is not None:
                    self._run_final(final)
                elif partials:
                    self._run_partials(partials)
            except Exception as exc:  # a bad decode must not kill the worker that serves every call
                log.exception("STT worker job failed")
                if final is not None and not final.future.done():
                    final.future.set_exception(exc)

    def _take_partials(self) -> list[TranscriptStream]:
        now = time.perf_counter()
        limit = self.settings.stale_partial_ms / 1000
        taken = []
        while self._partials and len(taken) < self.max_batch:
            _, (stream, requested) = self._partials.popitem(last=False)
            if limit and now - requested > limit:
                self.stats.partials_dropped += 1
                continue
            taken.append(stream)
        return taken

    def _decode(self, audios: list[np.ndarray], contexts: list[list[int]]) -> list[DecodeResult]:
        start = time.perf_counter()
        live = [i for i, a in enumerate(audios) if len(a) and float(np.sqrt(np.mean(a * a))) >= 1e-3]
        results = [DecodeResult([], "", 1.0, 0.0, len(a), skipped=True) for a in audios]
        if live:
            decoded = self.decoder.decode_batch([audios[i] for i in live], [contexts[i] for i in live],
                                                [[] for _ in live])
            for i, r in zip(live, decoded, strict=True):
                results[i] = r
        self.stats.decode_seconds += time.perf_counter() - start
        self.stats.audio_seconds += sum(len(a) for a in audios) / SAMPLE_RATE
        return results

    def _run_partials(self, streams: list[TranscriptStream]) -> None:
        work = []
        for stream in streams:
            with stream._lock:
                turn = stream._turn
                if turn.finished or turn.peeked or turn.n == 0 or stream.closed:
                    continue
                work.append((stream, turn, turn.audio(turn.requested_at or None), turn.rolled))
        if not work:
            return
        start = time.perf_counter()
        try:
            results = self._decode([w[2] for w in work], [w[0].context for w in work])
        except Exception:
            if len(work) == 1:
                raise
            # A fault in one stream's decode must not cost the streams batched with it their partials: each
            # decodes alone, and only the faulty one's fails (the worker logs it).
            log.exception("STT partial batch of %d streams failed; decoding them one at a time", len(work))
            for stream, *_ in work:
                try:
                    self._run_partials([stream])
                except Exception:
                    log.exception("STT partial of stream %d failed", stream.id)
            return
        ms = (time.perf_counter() - start) * 1000
        for (stream, turn, audio, rolled), result in zip(work, results, strict=True):
            if turn.rolled != rolled:  # the turn moved on to a new 30 s segment meanwhile
                continue
            turn.last = result
            turn.agreement.update(group_words(result.tokens, self.decoder.piece))
            self.stats.partials_done += 1
            if turn.finished or stream.on_partial is None:
                continue
            stable = _join(turn.segments, turn.agreement.committed_text)
            text = _join(turn.segments, turn.agreement.text_with())
            _call(stream.on_partial, Transcript(text, False, turn.id, stable, len(audio) / 16, ms))

    def _run_final(self, job: _FinalJob) -> None:
        start = time.perf_counter()
        if job.turn is None:  # one-shot transcription
            texts = []
            for offset in range(0, max(len(job.audio), 1), 30 * SAMPLE_RATE):
                texts.append(self._decode([job.audio[offset: offset + 30 * SAMPLE_RATE]], [job.context])[0].text)
            ms = (time.perf_counter() - start) * 1000
            _settle(job.future, Transcript(_join(texts[:-1], texts[-1]), True, -1, "", len(job.audio) / 16, ms))
            return
        turn = job.turn
        if job.segment is not None:
            turn.segments[job.segment] = self._decode([job.audio], [job.context])[0].text
            turn.pending_segments -= 1
            _settle(job.future, None)
            return
        self._finish_turn(job, start)

    def _finish_turn(self, job: _FinalJob, start: float | None = None) -> None:
        """Complete a turn's final: from a decode made during speech when one covers the end, else decode."""
        turn = job.turn
        last = self._reusable(turn, job.end)
        if last is not None:
            text, ms = last.text, 0.0
        else:
            start = time.perf_counter() if start is None else start
            decoded = self._decode([turn.audio(job.end)], [job.context])[0]
            if not decoded.text.strip() and job.end != job.speech_end:
                # An empty decode of a pause's partial (too little audio, or the model gave up) is a miss: the
                # final takes the audio up to the end of speech rather than answer the caller's words with nothing.
                decoded = self._decode([turn.audio(job.speech_end)], [job.context])[0]
            text = decoded.text
            ms = (time.perf_counter() - start) * 1000
            if not text and job.end >= EMPTY_FINAL_WARN_S * SAMPLE_RATE:
                self._empty_final(job, decoded)
        full = _join(turn.segments, text)
        result = Transcript(full, True, turn.id, full, job.end / 16, ms, last is not None)
        _settle(job.future, result)
        if job.peek:
            return
        self.stats.finals_done += 1
        if last is not None:
            self.stats.finals_reused += 1
        if job.stream is not None and job.stream.on_final is not None:
            _call(job.stream.on_final, result)

    def _empty_final(self, job: _FinalJob, decoded: DecodeResult) -> None:
        """A turn of speech (the VAD heard it) that gave no words: count it and log what whisper made of it."""
        self.stats.finals_empty += 1
        why = ("silent audio, not decoded" if decoded.skipped
               else f"dropped as no speech: {decoded.dropped_text!r}" if decoded.dropped_text else "no tokens")
        log.warning("STT stream %s: no words in %.2f s of speech (%s; no_speech_prob %.2f, avg_logprob %.2f)",
                    job.stream.id if job.stream else "-", job.end / SAMPLE_RATE, why, decoded.no_speech_prob,
                    decoded.avg_logprob)


EMPTY_FINAL_WARN_S = 0.5  # a final of at least this much audio with no words is logged (and counted)


def final_end(turn: _Turn, end: int) -> int:
    """Where the final of a turn whose speech ended at `end` stops decoding: at the latest partial request when that
    covers the end (at or past it, or short of it by a silent tail), so the final can reuse that decode; else at
    `end`. Both positions are set by the audio, so the final's text does not depend on when the worker ran."""
    requested = turn.requested_at
    if requested and (requested >= end or _silent_tail(turn.buffer[: turn.n], requested, end)):
        return requested
    return end
REUSE_TAIL_S = 0.25  # a decode may miss at most this much audio before the end of speech...
TAIL_SPEECH_RATIO = 0.1  # ...and only if no 20 ms frame of it is louder than this share of the speech


def _silent_tail(audio: np.ndarray, decoded: int, end: int) -> bool:
    """True when audio[decoded:end] holds no speech: short, and every 20 ms frame of it much quieter than
    the utterance's loud frames. The VAD's end sample lies a little after the last voiced window, so a
    decode made just before speech_end often stops inside that silent stretch."""
    if decoded <= 0 or end - decoded > REUSE_TAIL_S * SAMPLE_RATE or end > len(audio):
        return False
    frame = SAMPLE_RATE // 50
    n = len(audio[:end]) // frame
    if n < 5:
        return False
    rms = np.sqrt(np.mean(np.square(audio[: n * frame].reshape(n, frame)), axis=1))
    loud = float(np.percentile(rms, 95))
    tail = audio[decoded:end]
    if not len(tail):
        return True
    m = max(1, len(tail) // frame)
    tail_rms = np.sqrt(np.mean(np.square(tail[: m * frame].reshape(m, -1) if len(tail) >= frame else tail[None]),
                               axis=1))
    return loud > 0 and float(tail_rms.max()) < TAIL_SPEECH_RATIO * loud


def _join(segments: list[str], text: str) -> str:
    return " ".join(p for p in [*segments, text] if p).strip()


def _call(callback: Callable[[Transcript], None], result: Transcript) -> None:
    try:
        callback(result)
    except Exception:
        log.exception("STT callback failed")


__all__ = ["AudioInputError", "STTOverloaded", "Transcriber", "TranscriberStats", "Transcript", "TranscriptStream"]


def _settle(future: Future, result: object) -> None:
    """Give a final its result, unless its caller has cancelled it meanwhile (a barge-in, a hang-up)."""
    with contextlib.suppress(InvalidStateError):
        future.set_result(result)
