"""Bad input to the speech rooms: a clear error or a no-op, never a crash or unbounded memory."""

from __future__ import annotations

import numpy as np
import pytest

from voicepipe.stt import Transcriber
from voicepipe.tts import Synthesizer
from voicepipe.vad import AudioInputError, SileroVAD, TurnDetector, VADStream

pytestmark = pytest.mark.e2e

RATE = 16000
TEN_MINUTES = 600 * RATE


def nan_chunk() -> np.ndarray:
    chunk = np.zeros(320, np.float32)
    chunk[100] = np.nan
    return chunk


def test_vad_rejects_nan_and_keeps_working(silero: SileroVAD) -> None:
    stream = VADStream(silero, RATE)
    with pytest.raises(AudioInputError, match="NaN"):
        stream.push(nan_chunk())
    inf = np.full(320, np.inf, np.float32)
    with pytest.raises(AudioInputError):
        stream.push(inf)
    assert stream.samples_seen == 0  # the bad chunks were not taken
    assert stream.push(np.zeros(1024, np.float32)) == []


@pytest.mark.parametrize("rate", [0, -8000, 11025, 44100, 48000])
def test_vad_rejects_unsupported_rates(silero: SileroVAD, rate: int) -> None:
    with pytest.raises(AudioInputError, match="sample rate"):
        VADStream(silero, rate)


@pytest.mark.parametrize("bad", [np.zeros((2, 160), np.float32), np.zeros(160, np.int32), [0.0] * 160])
def test_vad_rejects_wrong_shapes_and_types(silero: SileroVAD, bad) -> None:
    with pytest.raises(AudioInputError):
        VADStream(silero, RATE).push(bad)


def test_zero_length_chunks_are_no_ops(silero: SileroVAD, transcriber: Transcriber,
                                       synthesizer: Synthesizer) -> None:
    vad = TurnDetector(silero, RATE)
    assert vad.push(np.zeros(0, np.float32)) == [] and vad.push(np.zeros(0, np.int16)) == []
    stream = transcriber.open_stream(RATE)
    stream.push(np.zeros(0, np.float32))
    assert stream.finish().result(timeout=10).text == ""
    speech = synthesizer.open_stream(RATE)
    assert speech.push_text("") == []
    speech.end_text()
    assert list(speech.frames(timeout=10)) == []  # nothing to say: the stream just ends
    assert speech.done


def test_ten_minutes_of_silence_through_the_vad(silero: SileroVAD) -> None:
    detector = TurnDetector(silero, RATE)
    rng = np.random.default_rng(0)
    second = (rng.normal(0, 0.002, RATE)).astype(np.float32)  # a quiet line, not digital zero
    events = []
    for _ in range(600):
        events += detector.push(second)
        assert len(detector.stream._pending) < 512  # constant memory
    assert events + detector.flush() == []
    assert detector.stream.samples_seen == TEN_MINUTES


def test_ten_minutes_of_silence_through_the_stt(transcriber: Transcriber) -> None:
    stream = transcriber.open_stream(RATE)
    second = np.zeros(RATE, np.float32)
    buffer = stream._turn.buffer
    for _ in range(600):
        stream.push(second)
    turn = stream._turn
    assert turn.buffer is buffer and len(buffer) == transcriber.max_samples  # bounded: the 30 s window
    final = stream.finish().result(timeout=60)
    assert final.text == ""
    assert len(turn.segments) == 600 * RATE // transcriber.max_samples


def test_stt_rejects_nan_and_bad_rates(transcriber: Transcriber) -> None:
    stream = transcriber.open_stream(RATE)
    with pytest.raises(AudioInputError, match="NaN"):
        stream.push(nan_chunk())
    with pytest.raises(AudioInputError, match="sample rate"):
        transcriber.open_stream(0)
    with pytest.raises(AudioInputError):
        transcriber.transcribe(np.zeros(160, np.float32), sample_rate=-1)
    stream.push(np.zeros(320, np.int16))  # still usable after the bad chunk
    assert stream.finish().result(timeout=10).text == ""


def test_tts_rejects_bad_rates_and_text(synthesizer: Synthesizer) -> None:
    for rate in (0, 7999, 96000):
        with pytest.raises(ValueError, match="rate"):
            synthesizer.open_stream(rate)
    stream = synthesizer.open_stream(RATE)
    with pytest.raises(TypeError):
        stream.push_text(None)  # type: ignore[arg-type]
    # Symbols and emoji with nothing speakable do not crash the worker; the stream ends.
    stream.push_text("*** 🙂 ### ")
    stream.end_text()
    list(stream.frames(timeout=30))
    assert stream.done
    ok = synthesizer.open_stream(RATE)  # and the next stream still speaks
    ok.say("Still working.")
    assert len(list(ok.frames(timeout=30))) > 10
