"""Streaming Piper TTS: clause-by-clause output, intelligibility, cancel, and the playout cursor."""

from __future__ import annotations

import time
from contextlib import contextmanager

import numpy as np
import pytest

from voicepipe.audio import int16_to_float32
from voicepipe.stt import Transcriber, corpus_wer, normalize_words
from voicepipe.tts import SpeechStream, Synthesizer

pytestmark = pytest.mark.e2e

REPLY = ("Sure, I can book that table for you tonight, and I will send a confirmation "
         "to your email address right away.")


def tokens(text: str) -> list[str]:
    """Split like an LLM's token stream: words with their leading spaces."""
    words = text.split(" ")
    return [words[0]] + [" " + w for w in words[1:]]


def collect(stream: SpeechStream) -> np.ndarray:
    frames = list(stream.frames(timeout=30))
    assert frames and frames[-1].last
    return np.concatenate([f.samples for f in frames])


@contextmanager
def synthesizer_with(synthesizer: Synthesizer, **tts_settings):
    """The same voice with other TTS settings (its own worker)."""
    from voicepipe.config import TTSSettings

    other = Synthesizer(synthesizer.voice, TTSSettings(**tts_settings))
    try:
        yield other
    finally:
        other.close()


@pytest.mark.parametrize(("first_chunk_words", "first_chunk", "chunks"), [
    (0, "Sure, I can book that table for you tonight,", 2),  # the whole first clause
    (4, "Sure, I can book", 3),  # the default: four words, then clauses
])
def test_the_first_chunk_is_spoken_while_the_reply_is_still_coming(synthesizer: Synthesizer, first_chunk_words: int,
                                                                   first_chunk: str, chunks: int) -> None:
    with synthesizer_with(synthesizer, first_chunk_words=first_chunk_words, low_water_ms=0) as synth:
        stream = synth.open_stream(16000)
        words = tokens(REPLY)
        released = []
        fed = 0
        while not released:
            released = stream.push_text(words[fed])
            fed += 1
        assert released[0].text == first_chunk
        frame = stream.read(timeout=30)  # audio arrives while the rest of the reply is still to come
        assert frame is not None
        assert frame.origin.chunk_index == 0 and frame.origin.text == first_chunk
        assert frame.start_sample == 0 and len(frame.samples) == 320
        for w in words[fed:]:
            stream.push_text(w)
        stream.end_text()
        rest = list(stream.frames(timeout=30))
        assert {f.origin.chunk_index for f in rest} == set(range(chunks))
        assert [f.start_sample for f in [frame, *rest]] == [i * 320 for i in range(len(rest) + 1)]


@pytest.mark.parametrize(("low_water_ms", "released"), [(300, ["that table"]), (0, [])])
def test_words_go_to_synthesis_early_when_the_speech_runs_dry(synthesizer: Synthesizer, low_water_ms: int,
                                                               released: list[str]) -> None:
    """An LLM slower than speech: once the audio made so far is nearly played, the words received so far are
    synthesized rather than waiting for the clause to end (0 turns it off)."""
    with synthesizer_with(synthesizer, first_chunk_words=3, low_water_ms=low_water_ms) as synth:
        stream = synth.open_stream(16000)
        assert [c.text for c in stream.push_text("I can book that")] == ["I can book"]
        assert stream.read(timeout=30) is not None
        assert stream.push_text(" table") == []  # plenty of "I can book" is still to be played
        audio_s = stream.cursor.total_samples / 16000
        time.sleep(max(0.0, audio_s - (time.perf_counter() - stream.first_audio_at) - 0.15))
        assert [c.text for c in stream.push_text(" for")] == released
        stream.end_text()
        assert len(collect(stream))


@pytest.mark.parametrize("rate", [8000, 16000, 24000, 48000])
def test_output_rate_and_framing(synthesizer: Synthesizer, rate: int) -> None:
    stream = synthesizer.open_stream(rate)
    stream.say("Your order is ready.")
    frames = list(stream.frames(timeout=30))
    assert all(len(f.samples) == rate // 50 and f.sample_rate == rate for f in frames)
    seconds = len(frames) / 50
    spoken = stream.cursor.total_samples / rate
    assert abs(seconds - spoken) <= 0.05 and 0.8 < spoken < 3.0


def test_transcribing_the_output_gives_back_the_text(synthesizer: Synthesizer, transcriber: Transcriber) -> None:
    texts = [REPLY, "The train leaves from platform three in ten minutes.",
             "Dr. Smith can see you at 9:40 on Tuesday morning."]
    pairs = []
    for text in texts:
        stream = synthesizer.open_stream(16000)
        for t in tokens(text):
            stream.push_text(t)
        stream.end_text()
        audio = int16_to_float32(collect(stream))
        pairs.append((text.replace("Dr.", "Doctor"), transcriber.transcribe(audio).text))
    assert corpus_wer(pairs) <= 0.10, pairs


def test_cancel_mid_sentence_stops_within_one_frame(synthesizer: Synthesizer) -> None:
    stream = synthesizer.open_stream(16000)
    stream.say("This is a long answer that keeps going, with many words in it, so that we can interrupt "
               "it in the middle of a sentence, well before it is over.")
    got = [stream.read(timeout=30) for _ in range(25)]  # half a second of audio played
    assert all(f is not None for f in got)
    stream.cancel()
    assert stream.done  # at once: a read answers without waiting for the worker
    after = []
    while (frame := stream.read(timeout=0.2)) is not None:
        after.append(frame)
    assert sum(len(f.samples) for f in after) <= stream.frame_samples  # nothing beyond one frame
    assert stream.cancelled and stream.done
    stream.push_text("more text after cancel. ")  # ignored, no error
    assert stream.read(timeout=0.1) is None


def test_playout_cursor_midpoint_maps_to_a_middle_word(synthesizer: Synthesizer) -> None:
    text = "Please remember to bring your passport and your ticket to the airport tomorrow morning."
    stream = synthesizer.open_stream(16000)
    stream.say(text)
    audio = collect(stream)
    cursor = stream.cursor
    words = [w for o in cursor.origins for w in o.words]
    assert [w.text for w in words] == text.split()
    assert all(a.sample_end <= b.sample_start + 1 for a, b in zip(words, words[1:], strict=False))
    assert abs(cursor.total_samples - len(audio)) <= 320
    heard = cursor.heard(cursor.total_samples // 2)
    index = len(heard.words)  # the word being spoken at the midpoint
    assert len(words) * 0.25 <= index <= len(words) * 0.75, (index, heard.text)
    assert text.startswith(heard.text) and 0 < heard.char_end < len(text)
    assert normalize_words(heard.text) == normalize_words(" ".join(w.text for w in heard.words))


def test_word_boundaries_match_the_audio(synthesizer: Synthesizer, transcriber: Transcriber) -> None:
    """Cut at a word's start sample, the audio holds the word before it and not the word itself. (Whisper may
    render the sliver of the next word's onset as a short word, so the previous word is one of the last two.)"""
    text = "I would like to cancel my order for the blue bicycle today."
    with synthesizer_with(synthesizer, first_chunk_words=0) as synth:  # one chunk: one origin with every word
        stream = synth.open_stream(16000)
        stream.say(text)
        audio = int16_to_float32(collect(stream))
    words = stream.cursor.origins[0].words
    for index, before in [(6, "my"), (10, "blue")]:  # cut where "order" and "bicycle" start
        head = normalize_words(transcriber.transcribe(audio[: words[index].sample_start]).text)
        assert before in head[-2:] and words[index].text.lower() not in head, (words[index].text, head)


def test_a_slow_reader_holds_synthesis_back_without_losing_audio(synthesizer: Synthesizer) -> None:
    with synthesizer_with(synthesizer, max_queued_s=0.5, first_chunk_words=0) as small:
        stream = small.open_stream(16000)
        stream.say("One two three four five. Six seven eight nine ten. Eleven twelve thirteen fourteen.")
        time.sleep(3.0)  # nobody reads: the worker stops once half a second of audio waits
        held = stream.queued_frames
        assert stream.max_frames <= held < stream.max_frames + 150  # at most one clause beyond the bound
        assert not stream.done
        frames = list(stream.frames(timeout=30))
        assert frames[-1].last and len(stream.cursor.origins) == 3
        assert len(frames) * 320 >= stream.cursor.total_samples - 320  # nothing was dropped


def test_the_voice_session_sleeps_when_idle_and_takes_the_configured_threads(settings) -> None:
    """Spinning onnxruntime threads would take the CPU from the LLM and the STT between clauses."""
    from voicepipe.models import resolve_model
    from voicepipe.tts import load_aligned_voice

    voice = load_aligned_voice(resolve_model(settings.models.tts, "tts", settings.paths.models_dir), cpu_threads=1)
    options = voice.session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert options.intra_op_num_threads == 1
    assert len(voice.session.get_outputs()) == 2  # the audio and the patched-in phoneme alignments


def _rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024


def test_the_warm_up_at_load_takes_the_memory_of_a_longest_clause(settings) -> None:
    """A clause of ``max_clause_chars`` takes ~175 MB of onnxruntime's arena the first time. Synthesized once at
    load, the first long reply of the first call takes none: RSS after warm-up stays flat (issue 25's soak)."""
    from voicepipe.models import resolve_model
    from voicepipe.tts import load_aligned_voice
    from voicepipe.tts.voice import warm_up_text

    path = resolve_model(settings.models.tts, "tts", settings.paths.models_dir)
    text = warm_up_text(200)
    assert 180 <= len(text) <= 200 and not text.endswith(" ")
    voice = load_aligned_voice(path, warm_up_chars=200)
    before = _rss_mb()
    with Synthesizer(voice) as synth:
        synth.synthesize_clause("Of course, I can move your reservation from Saturday evening to Sunday afternoon for "
                                "the same party of six, so tell me which time suits you best and I will check it.")
    assert _rss_mb() - before < 20


def test_clauses_said_again_reuse_the_memory_they_took_the_first_time(settings) -> None:
    """onnxruntime's memory patterns plan one block for a whole run per input shape, used from the second run of
    that shape on. Replies say clauses of the same lengths again and again, and each such block fragmented the CPU
    arena: RSS grew by 25-30 MB every round of the clauses below (issue 25's soak). Without them a round said again
    takes no new memory."""
    from voicepipe.models import resolve_model
    from voicepipe.tts import load_aligned_voice
    from voicepipe.tts.voice import WARM_UP_WORDS, warm_up_text

    voice = load_aligned_voice(resolve_model(settings.models.tts, "tts", settings.paths.models_dir))
    assert not voice.session.get_session_options().enable_mem_pattern
    synth = Synthesizer(voice)
    words = WARM_UP_WORDS.split()
    clauses = [warm_up_text(200)] + [" ".join(words[:n]) for n in (30, 4, 20, 12, 26, 7)]
    try:
        rss_after_round = []
        for _ in range(3):
            for clause in clauses:
                synth.synthesize_clause(clause)
            rss_after_round.append(_rss_mb())
        assert rss_after_round[2] - rss_after_round[0] < 10, rss_after_round
    finally:
        synth.close()
