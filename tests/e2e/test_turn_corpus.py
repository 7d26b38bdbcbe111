"""The turn benchmark's labelled set, built with the real Piper voice and espeak-ng."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from voicepipe.bench.turn_corpus import LEAD_MS, RATE, TRAIL_MS, build_turn_corpus
from voicepipe.vad.boundary import AUDIBLE_PEAK

pytestmark = pytest.mark.e2e


def test_turn_corpus(synthesizer, tmp_path) -> None:
    calls = []
    corpus = build_turn_corpus(synthesizer, tmp_path, progress=lambda done, total: calls.append((done, total)))
    labels = collections.Counter(u.label for u in corpus)
    assert labels["complete"] >= 40 and labels["paused"] >= 40 and set(labels) == {"complete", "paused"}
    assert calls[-1] == (len(corpus), len(corpus)) and len(calls) == len(corpus)
    for u in corpus:
        assert u.audio.dtype == np.int16 and u.audio.ndim == 1
        level = np.abs(u.audio.astype(np.int32))
        lead = RATE * LEAD_MS // 1000
        assert not level[:lead].any() and level[lead] >= AUDIBLE_PEAK, u.name
        assert len(u.audio) - u.speech_end == RATE * TRAIL_MS[u.label] // 1000, u.name
        assert level[u.speech_end - 1] >= AUDIBLE_PEAK and level[u.speech_end:].max() < AUDIBLE_PEAK, u.name
        if u.label == "complete":
            assert u.fragment is None and u.pause_start is None and u.pause_end is None
            continue
        assert u.text.startswith(u.fragment + " ")
        assert lead < u.pause_start < u.pause_end < u.speech_end, u.name
        assert u.pause_end - u.pause_start >= RATE * 480 // 1000, u.name
        assert level[u.pause_start:u.pause_end].max() < AUDIBLE_PEAK, u.name
        # speech, not a fading tail, within 200 ms either side: peaks of -20 dBFS and more
        assert level[u.pause_start - RATE // 5: u.pause_start].max() >= 10 * AUDIBLE_PEAK, u.name
        assert level[u.pause_end: u.pause_end + RATE // 5].max() >= 10 * AUDIBLE_PEAK, u.name
    pauses = [(u.pause_end - u.pause_start) * 1000 / RATE for u in corpus if u.label == "paused"]
    assert min(pauses) < 600 and max(pauses) > 1150
    voices = {u.voice for u in corpus}
    assert len({v for v in voices if v.startswith("piper:")}) >= 3
    espeak = [v.split(":") for v in voices if v.startswith("espeak:")]
    assert len({v[1] for v in espeak}) >= 4 and len({v[2] for v in espeak}) >= 3
    for label in ("complete", "paused"):
        assert {u.voice for u in corpus if u.label == label} == voices

    again = build_turn_corpus(synthesizer, tmp_path)
    assert [(u.name, u.text, u.voice, u.speech_end, u.pause_start, u.pause_end) for u in again] == \
        [(u.name, u.text, u.voice, u.speech_end, u.pause_start, u.pause_end) for u in corpus]
    for a, b in zip(again, corpus, strict=True):
        np.testing.assert_array_equal(a.audio, b.audio)
