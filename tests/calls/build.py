"""The shipped replay suite: each `tests/calls/<case>/case.toml` is committed; its `caller.wav` is built here, at
test time, from espeak-ng and Piper speech (and sox noise), and cached under tests/.generated/calls/.

Build by hand with `python -m tests.calls.build`, then `voicepipe replay tests/calls`. Each script is the caller's
channel from the start of the call: quiet line, speech, pauses sized for the agent's reply to play out (the
suite's server keeps replies short: `calls.max_reply_tokens=24`), and in the barge-in case speech over the reply.
The echo case's channel is clean: its speakerphone echo is of the replay's own replies, mixed in as they play.
The pauses and the latency budgets leave room for a slow, shared 2-core CPU (voice-to-voice up to ~15 s there);
on real hardware, tighten the budgets.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np

from tests.speech_corpus import GENERATED, RATE, espeak, pink_noise, piper_clip, trim
from voicepipe.caller import write_wav

SUITE = Path(__file__).parent
SUITE_SETTINGS = {"calls": {"max_reply_tokens": 24}}  # what the suite's cases are timed for: a reply plays ~5 s
FLOOR_RMS = 0.003  # a quiet phone line, about -50 dBFS

# A step: ("pause", seconds) | ("espeak", text) | ("piper", text); ("noise", rms) adds sox pink noise to it all.
SCRIPTS: dict[str, list[tuple]] = {
    "booking": [("pause", 3.0), ("espeak", "I want to book a table for dinner."), ("pause", 24.0),
                ("piper", "Please book a table for two people at seven tonight."), ("pause", 24.0),
                ("espeak", "Thank you very much for your help today."), ("pause", 6.0)],
    "barge_in": [("pause", 3.0), ("piper", "Tell me about the weather in London."), ("pause", 4.0),
                 ("espeak", "What is the capital of France?"), ("pause", 10.0)],
    "long_pause": [("pause", 3.0), ("espeak", "I would like to book a table"), ("pause", 0.5),
                   ("espeak", "for two people on Friday evening."), ("pause", 8.0)],
    "silent_caller": [("pause", 9.0)],
    "noisy_line": [("pause", 3.0), ("piper", "What time does the store close on Sunday evening?"),
                   ("pause", 9.0), ("noise", 0.02)],
    # Said into a speakerphone: the replay mixes the echo of its own replies in (the case's [echo]), not here.
    "echo": [("pause", 4.0), ("espeak", "What time do you open on Saturday morning?"), ("pause", 24.0),
             ("piper", "Can I bring my dog to the terrace?"), ("pause", 24.0),
             ("piper", "Thank you, that is all I needed to know."), ("pause", 6.0)],
}


def render(script: list[tuple], voice_loader) -> np.ndarray:
    parts, noise = [], None
    for step in script:
        kind = step[0]
        if kind == "pause":
            parts.append(np.zeros(int(step[1] * RATE), np.float32))
        elif kind == "espeak":
            parts.append(trim(espeak(step[1], "en-us", 150)))
        elif kind == "piper":
            parts.append(trim(piper_clip(voice_loader(), step[1])))
        elif kind == "noise":
            noise = step[1]
    audio = np.concatenate(parts)
    audio = audio + pink_noise(len(audio), FLOOR_RMS) + (pink_noise(len(audio), noise) if noise else 0)
    return (np.clip(audio, -1, 1) * 32767).astype(np.int16)


def build_suite(voice_loader, names: list[str] | None = None) -> list[Path]:
    """Write `caller.wav` into each case directory (from the cache when its script is unchanged)."""
    cache = GENERATED / "calls"
    cache.mkdir(parents=True, exist_ok=True)
    out = []
    for name, script in SCRIPTS.items():
        if names and name not in names:
            continue
        tag = hashlib.sha256(json.dumps([name, script, FLOOR_RMS]).encode()).hexdigest()[:12]
        cached = cache / f"{name}-{tag}.wav"
        if not cached.is_file():
            write_wav(cached, render(script, voice_loader), RATE)
        shutil.copyfile(cached, SUITE / name / "caller.wav")
        out.append(SUITE / name)
    return out


def piper_voice_loader(settings):
    """A lazy loader of the default Piper voice (only cases with Piper speech need it, and only once)."""
    voice = []

    def load():
        if not voice:
            from voicepipe.models import resolve_model
            from voicepipe.tts import load_aligned_voice

            voice.append(load_aligned_voice(resolve_model(settings.models.tts, "tts", settings.paths.models_dir)))
        return voice[0]

    return load


if __name__ == "__main__":
    from voicepipe.config import load_settings

    for path in build_suite(piper_voice_loader(load_settings())):
        print(path)
