"""Streaming STT with the real whisper model on the spoken corpus."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from tests.speech_corpus import RATE, Corpus
from voicepipe.audio import resample
from voicepipe.stt import Transcriber, Transcript, corpus_wer, normalize_words, wer

pytestmark = pytest.mark.e2e

CHUNK = RATE // 50  # 20 ms


@pytest.mark.parametrize(("name", "limit"), [("piper", 0.10), ("espeak", 0.20)])
def test_word_error_rate(transcriber: Transcriber, corpora: dict[str, Corpus], name: str, limit: float) -> None:
    pairs = [(u.text, transcriber.transcribe(u.audio).text) for u in corpora[name].utterances]
    assert corpus_wer(pairs) <= limit, pairs


def stream_in_real_time(transcriber: Transcriber, audio: np.ndarray, end_sample: int | None = None,
                        rate: int = RATE) -> tuple[Transcript, list[tuple[float, Transcript]], float]:
    """Push `audio` in 20 ms chunks at real-time pace; returns (final, [(time, partial)], time of last push)."""
    partials: list[tuple[float, Transcript]] = []
    lock = threading.Lock()

    def on_partial(t: Transcript) -> None:
        with lock:
            partials.append((time.perf_counter(), t))

    stream = transcriber.open_stream(rate, on_partial=on_partial)
    chunk = rate // 50
    start = time.perf_counter()
    for i in range(0, len(audio), chunk):
        stream.push(audio[i: i + chunk])
        delay = start + (i + chunk) / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
    last_push = time.perf_counter()
    final = stream.finish(end_sample).result(timeout=30)
    stream.close()
    return final, partials, last_push


def pick(corpus: Corpus, seconds: float):
    """The utterance whose length is closest to `seconds`."""
    return min(corpus.utterances, key=lambda u: abs(len(u.audio) / RATE - seconds))


@pytest.mark.parametrize("name", ["piper", "espeak"])
def test_partials_arrive_during_a_3s_utterance(transcriber: Transcriber, corpora: dict[str, Corpus],
                                               name: str) -> None:
    u = pick(corpora[name], 3.0)
    assert 2.4 <= len(u.audio) / RATE <= 3.8
    final, partials, last_push = stream_in_real_time(transcriber, u.audio)
    early = [p for t, p in partials if t < last_push and p.text]
    assert early, "no partial transcript before the end of the utterance"
    assert all(not p.is_final for _, p in partials)
    # The stable (committed) part only grows.
    stable = [normalize_words(p.stable_text) for _, p in partials]
    for before, after in zip(stable, stable[1:], strict=False):
        assert after[: len(before)] == before
    assert wer(u.text, final.text) <= 0.25, final.text


@pytest.mark.parametrize(("name", "index"), [("piper", 8), ("espeak", 2), ("espeak", 6)])
def test_streaming_in_20ms_chunks_gives_the_whole_file_transcript(transcriber: Transcriber,
                                                                  corpora: dict[str, Corpus],
                                                                  name: str, index: int) -> None:
    u = corpora[name].utterances[index]
    # the same audio the VAD would hand over: a little silence, the utterance, 300 ms of trailing silence
    audio = np.concatenate([np.zeros(RATE // 5, np.float32), u.audio, np.zeros(3 * RATE // 10, np.float32)])
    final, _, _ = stream_in_real_time(transcriber, audio)
    whole = transcriber.transcribe(audio)
    assert final.is_final
    assert normalize_words(final.text) == normalize_words(whole.text)
    assert wer(u.text, final.text) <= 0.25, final.text


def test_final_with_vad_end_reuses_work_done_during_speech(transcriber: Transcriber,
                                                           corpora: dict[str, Corpus]) -> None:
    u = corpora["piper"].utterances[2]
    lead = RATE // 5
    end = lead + len(u.audio) + RATE // 20  # where the VAD would put speech_end
    audio = np.concatenate([np.zeros(lead, np.float32), u.audio, np.zeros(RATE // 2, np.float32)])
    covered = threading.Event()
    stream = transcriber.open_stream(RATE, on_partial=lambda t: t.audio_ms * 16 >= end and covered.set())
    for i in range(0, len(audio), CHUNK):
        stream.push(audio[i: i + CHUNK])
        time.sleep(0.005)
    deadline = time.monotonic() + 30
    while not covered.wait(0.02) and time.monotonic() < deadline:
        stream.push(np.zeros(CHUNK, np.float32))  # the line stays open, as in a call
    assert covered.is_set(), "no partial decode reached the end of speech"
    before = transcriber.stats.finals_reused
    final = stream.finish(end).result(timeout=30)
    assert final.reused and final.decode_ms == 0.0  # no model ran for the final: it costs no decode, on any machine
    assert transcriber.stats.finals_reused == before + 1
    assert wer(u.text, final.text) <= 0.25, final.text
    # (A final whose end no decode has reached runs its own decode: tests/unit/test_stt_worker.py.)


def test_8khz_input_is_resampled(transcriber: Transcriber, corpora: dict[str, Corpus]) -> None:
    u = corpora["piper"].utterances[0]
    audio8k = resample(np.concatenate([np.zeros(RATE // 5, np.float32), u.audio]), RATE, 8000)
    stream = transcriber.open_stream(8000)
    for i in range(0, len(audio8k), 160):
        stream.push(audio8k[i: i + 160])
    final = stream.finish().result(timeout=30)
    assert wer(u.text, final.text) <= 0.15, final.text


def test_initial_prompt_biases_the_vocabulary(transcriber: Transcriber, synthesizer) -> None:
    """A made-up business name comes out close to its spelling only when the call's prompt names it."""
    from piper.config import SynthesisConfig

    quiet = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)  # Piper without its random noise: same audio
    voice = synthesizer.voice
    clip = np.concatenate([c.audio_float_array for c in voice.synthesize(
        "I would like to order a pizza from Kwiknosh.", quiet)])
    audio = np.concatenate([np.zeros(RATE // 5, np.float32), resample(clip, voice.config.sample_rate, RATE)])
    prompt, hotwords = "Kwiknosh is a restaurant.", "Kwiknosh"
    plain = transcriber.transcribe(audio).text
    biased = transcriber.transcribe(audio, initial_prompt=prompt, hotwords=hotwords).text
    assert "kwikn" not in plain.lower(), plain
    assert "kwikn" in biased.lower(), biased
    # A stream carries its own prompt to every decode; another call's stream does not get it.
    stream = transcriber.open_stream(RATE, initial_prompt=prompt, hotwords=hotwords)
    other = transcriber.open_stream(RATE)
    assert stream.context == transcriber.decoder.context_tokens(prompt, hotwords) and other.context == []
    stream.push(audio)
    other.push(audio)
    assert wer(biased, stream.finish().result(timeout=30).text) <= 0.2
    assert "kwikn" not in other.finish().result(timeout=30).text.lower()
