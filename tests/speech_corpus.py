"""A small spoken test corpus, built at test time and cached under tests/.generated/ (git-ignored).

Ten sentences of 5-15 words are spoken by espeak-ng (several voices and speeds) and by the Piper voice,
trimmed to their speech, and joined with 1-2 s gaps over a quiet pink-noise floor (made by sox). One
gap also holds a 200 ms white-noise burst, which is not speech. The truth timings come from the
construction itself.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import wave
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from voicepipe.audio import resample

RATE = 16000
GENERATED = Path(__file__).parent / ".generated"

SENTENCES = [
    "Please book a table for two people at seven tonight.",
    "My daughter has three cats and two small dogs.",
    "Can you tell me the weather in Boston tomorrow morning?",
    "I would like to cancel my order.",
    "The train leaves from platform three in ten minutes.",
    "Thank you very much for your help today.",
    "What time does the store close on Sunday evening?",
    "I need to speak with someone about my bill.",
    "Send the report to my email address before Friday afternoon.",
    "Yes, that sounds good to me.",
]

# (voice, words per minute) for espeak-ng, one per sentence, cycling.
ESPEAK_VOICES = [("en-us", 150), ("en-gb", 160), ("en-us+m3", 140), ("en-gb-x-rp", 165), ("en-us+f2", 150)]
NOISE_RMS = 0.003  # the background floor, about -50 dBFS
CORPUS_VERSION = 3


@dataclass
class Utterance:
    text: str
    start: int  # first speech sample in the joined file
    end: int  # one past the last speech sample
    audio: np.ndarray  # the trimmed clip alone (float32, 16 kHz, no noise)


@dataclass
class Corpus:
    name: str
    audio: np.ndarray  # float32 at RATE
    utterances: list[Utterance]
    bursts: list[tuple[int, int]] = field(default_factory=list)  # noise bursts (not speech)
    rate: int = RATE


def read_wav(data: bytes) -> tuple[np.ndarray, int]:
    with wave.open(io.BytesIO(data)) as w:
        rate, width, channels = w.getframerate(), w.getsampwidth(), w.getnchannels()
        frames = w.readframes(w.getnframes())
    if width != 2:
        raise ValueError(f"expected 16-bit wav, got {width * 8}-bit")
    samples = np.frombuffer(frames, dtype="<i2").astype(np.float32) / 32768.0
    if channels > 1:
        samples = samples.reshape(-1, channels).mean(axis=1)
    return samples, rate


def espeak(text: str, voice: str, wpm: int) -> np.ndarray:
    out = subprocess.run(["espeak-ng", "-v", voice, "-s", str(wpm), "--stdout", text],
                         check=True, capture_output=True).stdout
    samples, rate = read_wav(out)
    return resample(samples.astype(np.float32), rate, RATE)


def piper_clip(voice, text: str) -> np.ndarray:
    """Piper without its random noise terms, so the corpus is the same on every machine and run."""
    from piper.config import SynthesisConfig

    quiet = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    audio = np.concatenate([c.audio_float_array for c in voice.synthesize(text, quiet)]).astype(np.float32)
    return resample(audio * 0.7, voice.config.sample_rate, RATE)


def trim(audio: np.ndarray, level: float = 0.02) -> np.ndarray:
    """Cut leading and trailing near-silence (5 ms resolution), keeping the speech itself."""
    hop = RATE // 200
    n = len(audio) // hop
    peaks = np.abs(audio[: n * hop]).reshape(n, hop).max(axis=1)
    loud = np.nonzero(peaks > level)[0]
    if not len(loud):
        raise ValueError("clip has no speech")
    return audio[loud[0] * hop: (loud[-1] + 1) * hop].copy()


def pink_noise(n: int, rms: float) -> np.ndarray:
    out = subprocess.run(["sox", "-R", "-n", "-r", str(RATE), "-b", "16", "-c", "1", "-t", "wav", "-",
                          "synth", f"{n / RATE + 0.1:.3f}", "pinknoise"], check=True, capture_output=True).stdout
    noise, _ = read_wav(out)
    noise = noise[:n]
    return (noise / (np.sqrt(np.mean(noise**2)) + 1e-9) * rms).astype(np.float32)


def join(name: str, clips: list[tuple[str, np.ndarray]], seed: int, burst_after: int | None = None) -> Corpus:
    rng = np.random.default_rng(seed)
    parts: list[np.ndarray] = [np.zeros(RATE, dtype=np.float32)]
    pos = RATE
    utterances, bursts = [], []
    for i, (text, clip) in enumerate(clips):
        utterances.append(Utterance(text, pos, pos + len(clip), clip))
        parts.append(clip)
        pos += len(clip)
        gap = np.zeros(round(rng.uniform(1.0, 2.0) * RATE), dtype=np.float32)
        if burst_after == i:
            at = len(gap) // 2 - RATE // 10
            gap[at: at + RATE // 5] = rng.normal(0, 0.1, RATE // 5).astype(np.float32)
            bursts.append((pos + at, pos + at + RATE // 5))
        parts.append(gap)
        pos += len(gap)
    audio = np.concatenate(parts)
    audio = np.clip(audio + pink_noise(len(audio), NOISE_RMS), -1, 1).astype(np.float32)
    return Corpus(name, audio, utterances, bursts)


def _save(corpus: Corpus, path: Path) -> None:
    meta = {"name": corpus.name, "bursts": corpus.bursts,
            "utterances": [{"text": u.text, "start": u.start, "end": u.end} for u in corpus.utterances]}
    np.save(path.with_suffix(".npy"), corpus.audio)
    path.with_suffix(".json").write_text(json.dumps(meta))


def _load(path: Path) -> Corpus | None:
    if not path.with_suffix(".json").is_file() or not path.with_suffix(".npy").is_file():
        return None
    meta = json.loads(path.with_suffix(".json").read_text())
    audio = np.load(path.with_suffix(".npy"))
    utts = []
    for u in meta["utterances"]:
        utts.append(Utterance(u["text"], u["start"], u["end"], np.zeros(0, np.float32)))
    corpus = Corpus(meta["name"], audio, utts, [tuple(b) for b in meta["bursts"]])
    return corpus


def _clean_clips(corpus: Corpus, clips: list[np.ndarray]) -> Corpus:
    for u, clip in zip(corpus.utterances, clips, strict=True):
        u.audio = clip
    return corpus


def build_corpora(voice) -> dict[str, Corpus]:
    """The espeak and Piper corpora, from the cache when the spec has not changed."""
    GENERATED.mkdir(parents=True, exist_ok=True)
    spec = json.dumps([CORPUS_VERSION, SENTENCES, ESPEAK_VOICES, NOISE_RMS]).encode()
    tag = hashlib.sha256(spec).hexdigest()[:12]
    out = {}
    for name in ("espeak", "piper"):
        path = GENERATED / f"corpus-{name}-{tag}"
        clips_path = GENERATED / f"corpus-{name}-{tag}-clips.npz"
        corpus = _load(path)
        if corpus is not None and clips_path.is_file():
            with np.load(clips_path) as z:
                out[name] = _clean_clips(corpus, [z[f"c{i}"] for i in range(len(SENTENCES))])
            continue
        if name == "espeak":
            clips = [trim(espeak(t, *ESPEAK_VOICES[i % len(ESPEAK_VOICES)])) for i, t in enumerate(SENTENCES)]
        else:
            clips = [trim(piper_clip(voice, t)) for t in SENTENCES]
        corpus = join(name, list(zip(SENTENCES, clips, strict=True)), seed=7 if name == "espeak" else 11,
                      burst_after=2)
        _save(corpus, path)
        np.savez(clips_path, **{f"c{i}": c for i, c in enumerate(clips)})
        out[name] = corpus
    return out
