"""The labelled caller utterances of `voicepipe bench turns`: complete sentences, and sentences with a pause in
the middle ("I want to book a table for ... two people at seven tonight.").

Spoken by the Piper voice (at several `length_scale`s, without its noise terms so that every build gives the same
samples) and by espeak-ng (several voices and rates), at 16 kHz int16 with 300 ms of silence before the speech and
3 s (complete) or 1.5 s (paused) after it. The pause is made inside the whole sentence, so the fragment keeps its
mid-sentence prosody: Piper's audio is cut near the word boundary that its phoneme alignments give (see `_piper`),
espeak-ng is given an SSML break there (see `_espeak`); either way the pause is then exactly the requested length of
digital silence. There is no noise floor: a benchmark that wants a noisy line adds it.

The truth (`speech_end`, `pause_start`, `pause_end`) is read off the finished audio with the same notion of
"audible" as `voicepipe.vad.boundary`, so it does not depend on the VAD under test. A build takes ~15 s on two
cores; `build_turn_corpus` keeps it in `cache_dir` under a hash of everything it is made from.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from xml.sax.saxutils import escape

import numpy as np

from voicepipe.audio import float32_to_int16, int16_to_float32, resample
from voicepipe.replay.audio import read_caller_channel
from voicepipe.tts import Synthesizer
from voicepipe.tts.alignment import speech_phonemes, word_spans
from voicepipe.vad.boundary import AUDIBLE_PEAK, FRAME_MS, NOISE_MARGIN

if TYPE_CHECKING:
    from piper import PiperVoice
RATE = 16000

COMPLETE = [
    "Yes, that's right.",
    "No, that's not what I ordered.",
    "What time do you open on Saturday?",
    "I'd like to book a table for four people at eight tonight.",
    "Can you tell me my account balance?",
    "My account number is four seven two nine one five.",
    "I need to reschedule my appointment.",
    "Please cancel my subscription.",
    "The address is twelve Baker Street.",
    "Could you send me a copy of the invoice?",
    "I've been waiting for my package for two weeks.",
    "That's all, thank you.",
    "How much does the premium plan cost per month?",
    "My phone number is five five five, two one eight, four four nine zero.",
    "I want to speak to a manager.",
    "Is the store open on public holidays?",
    "I'd like to change my delivery address.",
    "The card ends in three three eight one.",
    "Can I pay with a credit card?",
    "My name is Sarah Johnson.",
    "I'm calling about the charge on my last bill.",
    "Yes, please go ahead.",
    "No thanks, I'm fine.",
    "What's the status of my order?",
    "I was charged twice for the same order.",
    "Please transfer me to the billing department.",
    "The meeting is on Thursday at half past two.",
    "How long will the repair take?",
    "I'd like a refund for the broken headphones.",
    "My flight leaves at nine forty tomorrow morning.",
    "Can you repeat that, please?",
    "I forgot my password and I can't log in.",
    "We need a table for six on Friday evening.",
    "Do you deliver to the north side of town?",
    "My date of birth is the fourth of July, nineteen eighty five.",
    "I'd like to add another person to my plan.",
    "That works for me.",
    "The total came to forty two dollars and fifty cents.",
    "Is there a parking lot near the restaurant?",
    "I'll be there in about twenty minutes.",
    "Please call me back after five o'clock.",
    "The internet has been down since this morning.",
    "Can I change my seat to an aisle seat?",
    "My order number is seven three one four.",
    "Sure, that sounds good.",
    "How do I reset my router?",
    "I'd like to book a cleaning for next Tuesday.",
    "Thank you so much for your help.",
]

# (the unfinished fragment, the rest of the sentence). No commas: espeak-ng's longest gap must be the break.
PAUSED = [
    ("I want to book a table for", "two people at seven tonight."),
    ("My account number is", "four five seven two nine one."),
    ("Can you tell me how to", "reset my password?"),
    ("I'd like to change my", "delivery address."),
    ("The address is twelve", "Baker Street in Springfield."),
    ("I'm calling about the", "charge on my last bill."),
    ("Could you send the invoice to", "my work email?"),
    ("My phone number is five five five", "two one eight four four nine."),
    ("I need to cancel the", "dentist appointment on Thursday."),
    ("What time does the", "pharmacy close tonight?"),
    ("I'd like to order a", "large pizza with mushrooms."),
    ("Can I speak to someone in", "the billing department?"),
    ("The package was supposed to arrive on", "Monday morning."),
    ("My name is", "David Miller."),
    ("I was wondering if you could", "move my booking to Friday."),
    ("We are looking for a room with", "two beds and a view."),
    ("I paid with my", "credit card last week."),
    ("Is it possible to", "get a refund for this?"),
    ("The card number ends in", "four four one two."),
    ("I want to upgrade to the", "premium plan."),
    ("Could you check whether my", "order has shipped?"),
    ("I'll be arriving at around", "nine in the evening."),
    ("My date of birth is the", "third of March nineteen ninety."),
    ("I'd like to make an appointment with", "doctor Patel."),
    ("The problem started when I", "updated the app yesterday."),
    ("Can you tell me the", "opening hours for Sunday?"),
    ("I need a taxi from the", "airport to my hotel."),
    ("We'd like to reserve a table near", "the window."),
    ("My internet keeps dropping every", "few minutes."),
    ("I'm trying to find out where", "my package is."),
    ("The total on my receipt was", "sixty three dollars."),
    ("Please send the technician on", "Wednesday afternoon."),
    ("I have a question about my", "last payment."),
    ("Can you add a note that", "the gate code is four one one."),
    ("I'd like to transfer money from my", "savings account."),
    ("Our flight was delayed by", "almost three hours."),
    ("The zip code is nine four", "seven one zero."),
    ("Do you have any tables available for", "eight people tomorrow?"),
    ("I would like to return the", "shoes I bought online."),
    ("My daughter needs an appointment for", "a checkup next week."),
    ("I'm not sure if I", "turned off the oven."),
    ("Could you remind me what the", "cancellation fee is?"),
    ("The meeting has been moved to", "half past three."),
    ("I want to pay my bill with", "a different card."),
    ("Can you give me directions to", "the nearest branch?"),
    ("My reference number is", "seven one nine three."),
    ("I'm calling because my", "heater stopped working."),
    ("Is there any way to", "speed up the delivery?"),
]

# "piper:<length_scale>" or "espeak:<voice>:<words per minute>"; sentence i of each label gets VOICES[i % 8].
VOICES = ["piper:1.0", "espeak:en-us:160", "piper:0.85", "espeak:en-gb:150", "piper:1.2",
          "espeak:en-us+f3:175", "espeak:en-gb-x-rp:140", "espeak:en-us+m3:165"]
PAUSE_MS = (500, 1200)
PAUSE_SEED = 7
LEAD_MS = 300
TRAIL_MS = {"complete": 3000, "paused": 1500}
PEAK = 0.7  # every clip is scaled to this peak
FADE_MS = 5  # the speech either side of a cut fades out / in over this, so the cut does not click
# Piper's cut: the quietest 5 ms from this long before the aligned start of the next word to this long before it
CUT_WINDOW_MS = (50, 10)
QUIET = 2e-4  # below this (float) a sample of espeak-ng's output is part of a gap
CORPUS_VERSION = 2  # bump when the audio a spec gives changes


@dataclass(frozen=True, eq=False)
class LabelledUtterance:
    """One caller utterance. Sample positions are in `audio`; ends are one past the last audible sample."""

    name: str
    text: str
    fragment: str | None  # the words before the pause (None for complete utterances)
    voice: str  # e.g. "piper:1.0", "espeak:en-gb:150"
    label: str  # "complete" or "paused"
    audio: np.ndarray  # int16 mono at 16 kHz
    speech_end: int
    pause_start: int | None = None  # the fragment's last audible sample + 1
    pause_end: int | None = None  # the continuation's first audible sample


def pause_lengths_ms(n: int, seed: int = PAUSE_SEED) -> list[int]:
    """`n` pause lengths spread evenly over PAUSE_MS, in a seeded random order."""
    spread = np.linspace(*PAUSE_MS, n).round().astype(int)
    return [int(ms) for ms in np.random.default_rng(seed).permutation(spread)]


def audible_span(audio: np.ndarray, start: int = 0, stop: int | None = None) -> tuple[int, int]:
    """(first audible sample, last audible sample + 1) of int16 `audio[start:stop]`, in `audio`'s positions.

    Audible as in `voicepipe.vad.boundary`: above AUDIBLE_PEAK and NOISE_MARGIN times the peak of the quietest
    tenth of `audio`'s 10 ms frames. A frame is audible when its peak is, so the edges are the audible samples."""
    frame = RATE * FRAME_MS // 1000
    n = len(audio) // frame
    peaks = np.abs(audio[: n * frame].astype(np.int32)).reshape(n, frame).max(axis=1)
    floor = max(AUDIBLE_PEAK, NOISE_MARGIN * float(np.percentile(peaks, 10)))
    loud = np.flatnonzero(np.abs(audio[start:stop].astype(np.int32)) >= floor)
    if not len(loud):
        raise ValueError("no audible sound in that range")
    return start + int(loud[0]), start + int(loud[-1]) + 1


def splice_silence(audio: np.ndarray, start: int, end: int, silence: int, fade: int = 0) -> np.ndarray:
    """float `audio` with `audio[start:end]` replaced by `silence` zeros; the `fade` samples either side of the
    cut are faded out and in."""
    before, after = audio[:start].copy(), audio[end:].copy()
    ramp = np.arange(1, fade + 1, dtype=np.float32) / (fade + 1)  # rising, never 0 or 1
    if k := min(fade, len(before)):
        before[-k:] *= ramp[::-1][-k:]
    if k := min(fade, len(after)):
        after[:k] *= ramp[:k]
    return np.concatenate([before, np.zeros(silence, np.float32), after])


def build_turn_corpus(synthesizer_or_voice: Synthesizer | PiperVoice, cache_dir: Path | None,
                      progress: Callable[[int, int], None] | None = None) -> list[LabelledUtterance]:
    """The whole labelled set, COMPLETE then PAUSED; from `cache_dir` when it was built with the same spec.
    `synthesizer_or_voice` is a `voicepipe.tts.Synthesizer` or its Piper voice (with alignments)."""
    voice = synthesizer_or_voice.voice if isinstance(synthesizer_or_voice, Synthesizer) else synthesizer_or_voice
    specs = _specs()
    key = _cache_key(voice)
    if cache_dir is not None and (cached := _load(cache_dir, key)) is not None:
        if progress:
            progress(len(cached), len(cached))
        return cached
    out = []
    for i, (name, text, fragment, voice_name, label, pause_ms) in enumerate(specs):
        out.append(make_utterance(voice, name, text, fragment, voice_name, label, pause_ms))
        if progress:
            progress(i + 1, len(specs))
    if cache_dir is not None:
        _save(cache_dir, key, out)
    return out


def _specs() -> list[tuple[str, str, str | None, str, str, int | None]]:
    """(name, text, fragment, voice, label, pause_ms) of every item."""
    specs: list[tuple[str, str, str | None, str, str, int | None]] = [
        (f"complete-{i:02d}", text, None, VOICES[i % len(VOICES)], "complete", None)
        for i, text in enumerate(COMPLETE)]
    pauses = pause_lengths_ms(len(PAUSED))
    specs += [(f"paused-{i:02d}", f"{fragment} {rest}", fragment, VOICES[i % len(VOICES)], "paused", pauses[i])
              for i, (fragment, rest) in enumerate(PAUSED)]
    return specs


def make_utterance(piper_voice: PiperVoice, name: str, text: str, fragment: str | None, voice: str, label: str,
                   pause_ms: int | None) -> LabelledUtterance:
    """One item of the set: `text` spoken by `voice` ("piper:<length_scale>" or "espeak:<voice>:<wpm>"), with a
    `pause_ms` silence after `fragment` when there is one."""
    kind, *args = voice.split(":")
    silence = None if pause_ms is None else RATE * pause_ms // 1000
    if kind == "piper":
        clip, mid = _piper(piper_voice, text, fragment, float(args[0]), silence)
    else:
        clip, mid = _espeak(text, fragment, args[0], int(args[1]), silence)
    clip = float32_to_int16(clip * np.float32(PEAK / max(float(np.abs(clip).max()), 1e-6)))
    lead, trail = RATE * LEAD_MS // 1000, RATE * TRAIL_MS[label] // 1000
    first, last = audible_span(np.concatenate([clip, np.zeros(RATE, np.int16)]))  # a silent tail sets the floor
    audio = np.concatenate([np.zeros(lead, np.int16), clip[first:last], np.zeros(trail, np.int16)])
    speech_end = audible_span(audio)[1]
    if mid is None:
        return LabelledUtterance(name, text, None, voice, label, audio, speech_end)
    mid += lead - first
    return LabelledUtterance(name, text, fragment, voice, label, audio, speech_end,
                             pause_start=audible_span(audio, 0, mid)[1], pause_end=audible_span(audio, mid)[0])


def _piper(voice: PiperVoice, text: str, fragment: str | None, length_scale: float,
           silence: int | None) -> tuple[np.ndarray, int | None]:
    """The sentence at 16 kHz (float) with `silence` zeros cut in after `fragment`, and the silence's middle.

    Word spans as `Synthesizer.synthesize_clause` makes them, but here: with this item's rate and no noise terms
    (without touching the caller's synthesizer), and with the stress marks folded in (`_fold_stress`).
    The cut is not at the aligned start of the next word but up to CUT_WINDOW_MS before it, at the quietest 5 ms:
    Piper's audio runs 15-25 ms ahead of its alignment (the "s" of "Stop." starts 25 ms before its mark), and cut
    at the mark the continuation lost its first sound to the fragment ("from my | avings")."""
    from piper.config import SynthesisConfig

    config = SynthesisConfig(length_scale=length_scale, noise_scale=0.0, noise_w_scale=0.0)
    audio, alignments = [], []
    for chunk in voice.synthesize(text, config, include_alignments=True):
        if not chunk.phoneme_alignments:
            raise ValueError("the Piper voice gives no phoneme alignments: load it with load_aligned_voice")
        audio.append(chunk.audio_float_array)
        alignments += [(a.phoneme, int(a.num_samples)) for a in chunk.phoneme_alignments]
    rate = int(voice.config.sample_rate)
    out = resample(np.concatenate(audio).astype(np.float32), rate, RATE)
    if fragment is None:
        return out, None
    words = word_spans(text, _fold_stress(alignments), lambda w: sum(speech_phonemes(p) for p in voice.phonemize(w)))
    boundary = next(s for _, a, _, s, _ in words if a >= len(fragment)) * RATE // rate
    lo, hi = (boundary - RATE * ms // 1000 for ms in CUT_WINDOW_MS)
    w = RATE // 200
    cut = lo + int(np.argmin(np.convolve(np.abs(out[lo:hi]), np.ones(w) / w, mode="same")))
    return splice_silence(out, cut, cut, silence, RATE * FADE_MS // 1000), cut + silence // 2


def _fold_stress(alignments: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """A stress mark's samples given to the phoneme after it. Piper gives the marks samples of their own, the
    first part of the stressed vowel; `word_spans` skips them as not speech, so a word that starts with a stressed
    vowel ("the | airport") would start that much (50-100 ms) late and the fragment would end in "the air"."""
    out, carry = [], 0
    for phoneme, n in alignments:
        if phoneme in "ˈˌ":
            carry += n
        else:
            out.append((phoneme, n + carry))
            carry = 0
    return out


def _espeak(text: str, fragment: str | None, voice: str, wpm: int,
            silence: int | None) -> tuple[np.ndarray, int | None]:
    """The sentence at 16 kHz (float) from espeak-ng, with `silence` zeros after `fragment`, and their middle.

    An SSML <break> in the sentence, not the fragment spoken alone: espeak-ng then ends the fragment's clause
    without a final fall. Checked with en-us and en-gb: the last word before the break ("...a table for", "...number
    is") stays level at ~93-95 Hz, where the fragment alone with a full stop falls to ~78 Hz; it is ~10 Hz lower and
    ~40 ms longer than in the unbroken sentence, and the continuation restarts at the pitch of a new clause. The
    gap espeak-ng leaves (the break plus ~20-50 ms) is then replaced by exactly `silence` zeros."""
    if fragment is None:
        ssml = escape(text)
    else:
        ssml = f'{escape(fragment)} <break time="{silence * 1000 // RATE}ms"/> {escape(text[len(fragment):])}'
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "u.wav"
        subprocess.run(["espeak-ng", "-m", "-v", voice, "-s", str(wpm), "-w", str(path), f"<speak>{ssml}</speak>"],
                       check=True, capture_output=True)
        samples, rate = read_caller_channel(path)
    audio = resample(int16_to_float32(samples), rate, RATE)
    if fragment is None:
        return audio, None
    start, end = _longest_gap(audio)
    if end - start < silence // 2:
        raise RuntimeError(f"espeak-ng left no break in {text!r} ({voice}, {wpm} wpm)")
    return splice_silence(audio, start, end, silence), start + silence // 2


def _longest_gap(audio: np.ndarray) -> tuple[int, int]:
    """[start, end) of the longest run of QUIET samples that has sound on both sides."""
    quiet = np.concatenate([[0], (np.abs(audio) < QUIET).astype(np.int8), [0]])
    edges = np.diff(quiet)
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    inner = (starts > 0) & (ends < len(audio))
    if not inner.any():
        return 0, 0
    starts, ends = starts[inner], ends[inner]
    i = int(np.argmax(ends - starts))
    return int(starts[i]), int(ends[i])


def _cache_key(voice: PiperVoice) -> str:
    espeak = subprocess.run(["espeak-ng", "--version"], check=True, capture_output=True, text=True).stdout
    spec = [CORPUS_VERSION, COMPLETE, PAUSED, VOICES, PAUSE_MS, PAUSE_SEED, LEAD_MS, TRAIL_MS, PEAK, FADE_MS,
            CUT_WINDOW_MS, QUIET, espeak.strip(), dataclasses.asdict(voice.config)]
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _save(cache_dir: Path, key: str, items: list[LabelledUtterance]) -> None:
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cache_dir / f"turn-corpus-{key}.tmp.npz"
    np.savez(tmp, **{u.name: u.audio for u in items})
    os.replace(tmp, cache_dir / f"turn-corpus-{key}.npz")
    index = [{f.name: getattr(u, f.name) for f in dataclasses.fields(u) if f.name != "audio"} for u in items]
    (cache_dir / f"turn-corpus-{key}.json").write_text(json.dumps(index, indent=1))  # written last: complete


def _load(cache_dir: Path, key: str) -> list[LabelledUtterance] | None:
    index, audio = cache_dir / f"turn-corpus-{key}.json", cache_dir / f"turn-corpus-{key}.npz"
    if not index.is_file() or not audio.is_file():
        return None
    with np.load(audio) as z:
        return [LabelledUtterance(**item, audio=z[item["name"]]) for item in json.loads(index.read_text())]
