"""Streaming Silero VAD (v6 ONNX, as bundled with faster-whisper) on onnxruntime.

The model takes 512-sample windows at 16 kHz, each preceded by the last 64 samples of the previous window
(its context), and carries an LSTM state (h, c) of shape (1, 1, 128) from window to window. One
`SileroVAD` holds the shared ONNX session; each call opens its own `VADStream` with its own state.
8 kHz input is resampled to 16 kHz on the way in; every timestamp is reported in input samples.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from voicepipe.audio import StreamResampler
from voicepipe.config import VADSettings
from voicepipe.vad.model import load_silero
from voicepipe.vad.samples import SUPPORTED_VAD_RATES, check_rate, to_float32
from voicepipe.vad.turn import EndOfTurnPolicy, SilenceEndOfTurn, TurnView

MODEL_RATE = 16000
WINDOW = 512  # samples per model step at 16 kHz (32 ms)
CONTEXT = 64  # samples of the previous window prepended to each step
STATE_SHAPE = (1, 1, 128)
# Silero's recurrent state drifts over a long stretch of silence: after ~20-30 s of a quiet line (a caller listening
# to a long reply) it called speech up to 320 ms after it began, so the STT missed the turn's first words ("What is
# the capital of France?" heard as "in the capital of France"). The state is zeroed after this many windows of
# clear silence (5 s), as a fresh stream's is, and the VAD answers a speech start as fast as on a fresh stream.
RESET_QUIET_WINDOWS = 5 * MODEL_RATE // WINDOW

EventKind = Literal["speech_start", "speech_end", "end_of_turn"]


@dataclass(frozen=True)
class VADEvent:
    """A speech boundary at `sample` (index in the stream's own samples, from 0 at stream start)."""

    kind: EventKind
    sample: int
    sample_rate: int

    @property
    def seconds(self) -> float:
        return self.sample / self.sample_rate


class SileroVAD:
    """The shared Silero model. `run` is thread-safe (onnxruntime sessions are), so calls can share it."""

    def __init__(self, session) -> None:
        names = {i.name for i in session.get_inputs()}
        if names != {"input", "h", "c"}:
            raise ValueError(f"unexpected Silero VAD inputs {sorted(names)}; expected the v6 model (input, h, c)")
        self.session = session
        self.windows_run = 0
        self._count_lock = threading.Lock()

    @classmethod
    def load(cls, path: Path) -> SileroVAD:
        return cls(load_silero(path))

    def run(self, windows: np.ndarray, h: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Probabilities for consecutive windows of shape (n, CONTEXT + WINDOW); returns (probs, h, c)."""
        probs, h, c = self.session.run(None, {"input": windows, "h": h, "c": c})
        with self._count_lock:
            self.windows_run += len(windows)
        return np.asarray(probs, dtype=np.float32).reshape(-1), h, c

    def stream(self, sample_rate: int = 16000, settings: VADSettings | None = None) -> VADStream:
        return VADStream(self, sample_rate, settings)


class VADStream:
    """One call's VAD: push audio of any chunk size, get `speech_start` / `speech_end` events.

    - speech_start: once `min_speech_ms` of windows are at or above the threshold; its sample is where the
      first of those windows began, minus `padding_ms` (never before the previous speech_end).
    - speech_end: once `min_silence_ms` of windows are below the silence threshold; its sample is the end of
      the last window at or above the threshold, plus `padding_ms`.
    Memory is constant: at most one window of audio is held, whatever the input length. The model's recurrent
    state is zeroed after RESET_QUIET_WINDOWS of clear silence outside speech.
    """

    def __init__(self, vad: SileroVAD, sample_rate: int = 16000, settings: VADSettings | None = None) -> None:
        self.vad = vad
        self.sample_rate = check_rate(sample_rate, SUPPORTED_VAD_RATES, "VAD input")
        s = settings or VADSettings()
        self.settings = s
        self.threshold = s.threshold
        self.neg_threshold = s.neg_threshold if s.neg_threshold is not None else max(s.threshold - 0.15, 0.01)
        self._min_speech = _ms_to(s.min_speech_ms, MODEL_RATE)
        self._min_silence = _ms_to(s.min_silence_ms, MODEL_RATE)
        self._pad = _ms_to(s.padding_ms, MODEL_RATE)
        self._resampler = (None if self.sample_rate == MODEL_RATE
                           else StreamResampler(self.sample_rate, MODEL_RATE, dtype=np.float32))
        self.reset()

    def reset(self) -> None:
        """Forget all state (a new stream starting at sample 0)."""
        self._zero_state()
        self._context = np.zeros(CONTEXT, dtype=np.float32)
        self._pending = np.zeros(0, dtype=np.float32)
        self._model_pos = 0  # model-rate samples consumed into windows
        self._input_seen = 0
        self.in_speech = False
        self._cand_start: int | None = None
        self._silence_start: int | None = None
        self._last_end = 0
        self._voiced_end = 0
        self.last_prob = 0.0
        self._quiet_windows = 0  # consecutive windows of clear silence outside speech
        self.speech_samples = 0  # model-rate samples in speech segments so far (closed ones + the open one)
        self._segment_start = 0
        if self._resampler is not None:
            self._resampler.flush()

    @property
    def samples_seen(self) -> int:
        """Input samples pushed so far."""
        return self._input_seen

    @property
    def speech_pending(self) -> bool:
        """Windows above the threshold that are not yet `min_speech_ms` long: speech not yet confirmed or dropped."""
        return self._cand_start is not None

    @property
    def samples_processed(self) -> int:
        """Input samples the model has judged (lags `samples_seen` by less than one window)."""
        return self._to_input(self._model_pos)

    def push(self, samples: np.ndarray) -> list[VADEvent]:
        audio = to_float32(samples, "VAD input")
        if audio.size == 0:
            return []
        self._input_seen += len(audio)
        if self._resampler is not None:
            audio = self._resampler.process(audio)
        pending = np.concatenate([self._pending, audio]) if len(self._pending) else audio
        n = len(pending) // WINDOW
        self._pending = pending[n * WINDOW:].copy()
        if n == 0:
            return []
        body = pending[: n * WINDOW].reshape(n, WINDOW)
        contexts = np.concatenate([self._context[None], body[:-1, -CONTEXT:]], axis=0)
        windows = np.ascontiguousarray(np.concatenate([contexts, body], axis=1), dtype=np.float32)
        self._context = body[-1, -CONTEXT:].copy()
        events: list[VADEvent] = []
        done = 0
        while done < n:
            probs, self._h, self._c = self.vad.run(windows[done:], self._h, self._c)
            for prob in probs:
                self._step(float(prob), events)
                done += 1
                if self._quiet_windows >= RESET_QUIET_WINDOWS:  # zeroed here, whatever the chunking: the windows
                    self._zero_state()  # after this one run again from the fresh state
                    self._quiet_windows = 0
                    break
        return events

    def _zero_state(self) -> None:
        self._h = np.zeros(STATE_SHAPE, dtype=np.float32)
        self._c = np.zeros(STATE_SHAPE, dtype=np.float32)

    def flush(self) -> list[VADEvent]:
        """End of stream: close an open speech segment at the last sample seen."""
        if not self.in_speech:
            return []
        self.in_speech = False
        end = self._input_seen
        self.speech_samples += max(0, self._from_input(end) - self._segment_start)
        self._last_end = self._from_input(end)
        return [VADEvent("speech_end", end, self.sample_rate)]

    def _step(self, prob: float, events: list[VADEvent]) -> None:
        start = self._model_pos
        self._model_pos += WINDOW
        self.last_prob = prob
        quiet = not self.in_speech and prob < self.neg_threshold
        self._quiet_windows = self._quiet_windows + 1 if quiet else 0
        if prob >= self.threshold:
            self._silence_start = None
            self._voiced_end = self._model_pos
            if not self.in_speech:
                if self._cand_start is None:
                    self._cand_start = start
                if self._model_pos - self._cand_start >= max(self._min_speech, 1):
                    self.in_speech = True
                    begin = max(self._cand_start - self._pad, self._last_end, 0)
                    self._segment_start = begin
                    self._cand_start = None
                    events.append(VADEvent("speech_start", self._to_input(begin), self.sample_rate))
            return
        if not self.in_speech:
            self._cand_start = None
            return
        if prob >= self.neg_threshold:  # hysteresis: in-between counts as speech once speaking
            self._silence_start = None
            return
        if self._silence_start is None:
            self._silence_start = start
        if self._model_pos - self._silence_start >= self._min_silence:
            end = min(max(self._voiced_end, self._segment_start) + self._pad, self._model_pos)
            self.in_speech = False
            self._silence_start = None
            self._last_end = end
            self.speech_samples += max(0, end - self._segment_start)
            events.append(VADEvent("speech_end", self._to_input(end), self.sample_rate))

    def _to_input(self, model_sample: int) -> int:
        if self.sample_rate == MODEL_RATE:
            return model_sample
        return min(round(model_sample * self.sample_rate / MODEL_RATE), self._input_seen)

    def _from_input(self, input_sample: int) -> int:
        return round(input_sample * MODEL_RATE / self.sample_rate)


class TurnDetector:
    """VAD plus an end-of-turn policy for one call: adds `end_of_turn` events to the VAD's events.

    After `end_of_turn` the detector starts a new turn.
    """

    def __init__(self, vad: SileroVAD, sample_rate: int = 16000, settings: VADSettings | None = None,
                 policy: EndOfTurnPolicy | None = None) -> None:
        s = settings or VADSettings()
        self.stream = VADStream(vad, sample_rate, s)
        self.policy: EndOfTurnPolicy = policy or SilenceEndOfTurn(float(s.end_of_turn_silence_ms))
        self._new_turn()

    @property
    def sample_rate(self) -> int:
        return self.stream.sample_rate

    def _new_turn(self) -> None:
        self._start = 0
        self.speech_seen = False
        self.last_speech_end: int | None = None
        self._turn_speech = 0

    def view(self) -> TurnView:
        rate = self.stream.sample_rate
        silence = 0.0
        if not self.stream.in_speech and self.last_speech_end is not None:
            silence = max(0, self.stream.samples_processed - self.last_speech_end) * 1000 / rate
        speech_ms = self._turn_speech * 1000 / rate
        return TurnView(self.speech_seen, self.stream.in_speech, silence, speech_ms)

    def push(self, samples: np.ndarray) -> list[VADEvent]:
        """Push audio of any length; the policy is asked after every model window, so the events do not
        depend on how the audio was chunked."""
        step = WINDOW * self.stream.sample_rate // MODEL_RATE
        if len(samples) <= step:
            return self._push_window(samples)
        out: list[VADEvent] = []
        for i in range(0, len(samples), step):
            out += self._push_window(samples[i: i + step])
        return out

    def _push_window(self, samples: np.ndarray) -> list[VADEvent]:
        events = self.stream.push(samples)
        out: list[VADEvent] = []
        for ev in events:
            out.append(ev)
            if ev.kind == "speech_start":
                self.speech_seen = True
                self._start = ev.sample
            elif ev.kind == "speech_end":
                self.last_speech_end = ev.sample
                self._turn_speech += ev.sample - self._start
        return out + self.decide_again()

    def decide_again(self) -> list[VADEvent]:
        """Ask the policy at the window it was last asked at: [end_of_turn] if the turn is over. A policy that waited
        there for evidence (voicepipe/pipeline/turn_taking.py) is asked again once the evidence is in."""
        if self.speech_seen and self.policy.decide(self.view()):
            event = VADEvent("end_of_turn", self.stream.samples_processed, self.stream.sample_rate)
            self._new_turn()
            return [event]
        return []

    def flush(self) -> list[VADEvent]:
        events = self.stream.flush()
        if events or self.speech_seen:
            events = [*events, VADEvent("end_of_turn", self.stream.samples_seen, self.stream.sample_rate)]
            self._new_turn()
        return events


def _ms_to(ms: float, rate: int) -> int:
    return round(ms * rate / 1000)
