"""The pure parts of the turn benchmark's labelled set: audible edges, pause splicing, the sentence lists."""

from __future__ import annotations

import re

import numpy as np
import pytest

from voicepipe.bench import turn_corpus as tc
from voicepipe.bench.turn_corpus import COMPLETE, PAUSE_MS, PAUSED, RATE, LabelledUtterance, audible_span

FRAME = RATE // 100


def tone(ms: int, amplitude: int = 8000) -> np.ndarray:
    t = np.arange(RATE * ms // 1000) / RATE
    return (amplitude * np.sin(2 * np.pi * 220 * t + 0.5)).astype(np.int16)


def quiet(ms: int, noise: int = 0) -> np.ndarray:
    n = RATE * ms // 1000
    return np.random.default_rng(0).integers(-noise, noise + 1, n).astype(np.int16) if noise else np.zeros(n, np.int16)


@pytest.mark.parametrize("noise", [0, 120])  # digital silence, and a line hiss that lifts the floor to 4 x 120
def test_audible_edges_of_tone_pause_tone(noise: int) -> None:
    audio = np.concatenate([quiet(300), tone(500), quiet(700), tone(400), quiet(1500)])
    audio = (audio + quiet(len(audio) * 1000 // RATE, noise)).astype(np.int16)
    first_end, second_start = RATE * 800 // 1000, RATE * 1500 // 1000
    true_end = RATE * 1900 // 1000
    mid = (first_end + second_start) // 2
    assert abs(audible_span(audio, 0, mid)[1] - first_end) < FRAME  # pause_start
    assert abs(audible_span(audio, mid)[0] - second_start) < FRAME  # pause_end
    first, last = audible_span(audio)
    assert abs(first - RATE * 300 // 1000) < FRAME
    assert abs(last - true_end) < FRAME  # speech_end


def test_audible_span_ignores_sound_below_the_floor() -> None:
    audio = np.concatenate([quiet(200), tone(300), tone(200, amplitude=250), quiet(500)])
    assert audible_span(audio)[1] == pytest.approx(RATE * 500 // 1000, abs=FRAME)
    with pytest.raises(ValueError):
        audible_span(quiet(1000))


def test_splice_inserts_exactly_the_silence_at_the_boundary() -> None:
    audio = np.linspace(0.1, 0.9, 4000, dtype=np.float32)
    out = tc.splice_silence(audio, 1500, 1500, 8000, fade=80)
    assert len(out) == len(audio) + 8000
    assert not out[1500:9500].any()
    assert out[1499] != 0 and out[9500] != 0  # the fade never reaches zero: the silence is exactly 8000 samples
    np.testing.assert_array_equal(out[:1420], audio[:1420])
    np.testing.assert_array_equal(out[9580:], audio[1580:])
    assert np.all(np.abs(out[1420:1500]) < np.abs(audio[1420:1500]))


def test_splice_replaces_a_gap() -> None:
    audio = np.concatenate([np.ones(100), np.zeros(300), np.ones(50)]).astype(np.float32)
    out = tc.splice_silence(audio, 100, 400, 1000)
    assert len(out) == 1150
    assert not out[100:1100].any() and out[:100].all() and out[1100:].all()


def test_longest_gap_is_an_inner_one() -> None:
    audio = np.concatenate([np.zeros(5000), np.ones(100), np.zeros(300), np.ones(100), np.zeros(900),
                            np.ones(100), np.zeros(6000)]).astype(np.float32)
    assert tc._longest_gap(audio) == (5500, 6400)


def test_stress_marks_go_to_the_vowel_after_them() -> None:
    aligned = [("ð", 10), ("ə", 20), (" ", 5), ("ˈ", 30), ("ɛ", 40), ("ɹ", 15)]
    assert tc._fold_stress(aligned) == [("ð", 10), ("ə", 20), (" ", 5), ("ɛ", 70), ("ɹ", 15)]


def test_sentence_lists() -> None:
    assert len(COMPLETE) >= 40 and len(PAUSED) >= 40
    assert len(set(COMPLETE)) == len(COMPLETE) and len(set(PAUSED)) == len(PAUSED)
    assert all(re.fullmatch(r"[A-Z].*[.?]", text) for text in COMPLETE)
    for fragment, rest in PAUSED:
        assert re.fullmatch(r"[A-Z][\w' ]*\w", fragment), fragment  # unfinished: no final punctuation
        assert re.fullmatch(r"\w[\w' ]*[.?]", rest), rest  # no commas: espeak-ng's longest gap is the break


def test_pause_lengths_spread_over_the_range() -> None:
    pauses = tc.pause_lengths_ms(len(PAUSED))
    assert pauses == tc.pause_lengths_ms(len(PAUSED))  # seeded
    assert min(pauses) == PAUSE_MS[0] == 500 and max(pauses) == PAUSE_MS[1] == 1200
    assert len(set(pauses)) == len(pauses)
    assert pauses != sorted(pauses)
    assert pauses != tc.pause_lengths_ms(len(PAUSED), seed=1)


def test_specs_cycle_voices_and_rates() -> None:
    specs = tc._specs()
    assert [s[4] for s in specs].count("complete") == len(COMPLETE)
    assert [s[4] for s in specs].count("paused") == len(PAUSED)
    assert len({s[0] for s in specs}) == len(specs)
    for name, text, fragment, _, label, pause_ms in specs:
        assert (fragment is None) == (label == "complete") == (pause_ms is None), name
        assert fragment is None or text.startswith(fragment + " ")
    voices = {s[3] for s in specs}
    assert len({v for v in voices if v.startswith("piper:")}) >= 3
    espeak = [v.split(":") for v in voices if v.startswith("espeak:")]
    assert len({v[1] for v in espeak}) >= 4 and len({v[2] for v in espeak}) >= 3


def test_cache_round_trip(tmp_path) -> None:
    items = [LabelledUtterance("complete-00", "Yes.", None, "piper:1.0", "complete", tone(300), 4800),
             LabelledUtterance("paused-00", "My name is Ann.", "My name is", "espeak:en-gb:150", "paused",
                               tone(900), 14000, 3000, 11000)]
    tc._save(tmp_path, "k", items)
    loaded = tc._load(tmp_path, "k")
    assert tc._load(tmp_path, "other") is None
    assert [(u.name, u.fragment, u.voice, u.label, u.speech_end, u.pause_start, u.pause_end) for u in loaded] == \
        [(u.name, u.fragment, u.voice, u.label, u.speech_end, u.pause_start, u.pause_end) for u in items]
    for a, b in zip(loaded, items, strict=True):
        np.testing.assert_array_equal(a.audio, b.audio)
        assert a.audio.dtype == np.int16
