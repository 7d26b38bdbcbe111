"""Small recordings and cases on disk, in the formats `voicepipe replay` reads, for its unit tests."""

from __future__ import annotations

import json
import wave
from pathlib import Path

import numpy as np

from voicepipe.replay.case import load_case
from voicepipe.replay.checks import check_call
from voicepipe.replay.observed import ObservedCall, ObservedTurn
from voicepipe.replay.results import CaseResult

RATE = 16000


def tone(seconds: float, rate: int = RATE, amplitude: int = 8000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (amplitude * np.sin(2 * np.pi * 220 * t)).astype(np.int16)


def write_wav(path: Path, channels: list[np.ndarray], rate: int = RATE) -> Path:
    frames = np.stack(channels, axis=1).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(len(channels))
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(frames.tobytes())
    return path


TURNS = [
    {"t": 4.0, "type": "turn", "turn": 1, "user_text": "I want to book a table.", "agent_text": "Sure, for when?",
     "heard_text": None, "interrupted": False, "timings_ms": {"voice_to_voice": 900.0, "response": 500.0}},
    {"t": 9.0, "type": "turn", "turn": 2, "user_text": "Tomorrow at seven.",
     "agent_text": "Booked for tomorrow at seven, see", "heard_text": "Booked for tomorrow", "interrupted": True,
     "timings_ms": {"voice_to_voice": 1100.0, "response": 700.0}},
]


def write_recording(directory: Path, *, truncated: bool = False, transport: str = "twilio",
                    greeting: str | None = "Hi there.", keys: tuple[tuple[float, str], ...] = ()) -> Path:
    """A 10 s stereo recording (caller left: a tone; agent right: silence) and its events, two turns (and the
    caller's `keys`: (t, key) dtmf events)."""
    directory.mkdir(parents=True, exist_ok=True)
    caller = np.concatenate([np.zeros(RATE, np.int16), tone(1.0), np.zeros(8 * RATE, np.int16)])
    write_wav(directory / "call.wav", [caller, np.zeros_like(caller)])
    events = [{"t": 0, "type": "call_start", "call_id": directory.name, "transport": transport, "started": 1.7e9,
               "sample_rate": RATE, "system_prompt": "Be brief.", "greeting": greeting, "metadata": {}},
              {"t": 1.0, "type": "inbound", "bytes": 320, "samples": 160},
              {"t": 1.0, "type": "vad", "kind": "speech_start"},
              TURNS[0],
              {"t": 7.0, "type": "vad", "kind": "speech_start"},
              {"t": 7.4, "type": "clear"},
              {"t": 7.4, "type": "barge_in", "turn": 2, "heard_text": "Booked for tomorrow"},
              TURNS[1], *({"t": t, "type": "dtmf", "digit": key} for t, key in keys)]
    lines = [json.dumps(e) for e in events]
    if truncated:
        lines.append('{"t": 9.5, "type": "agent_au')  # the process died mid-line
        text = "\n".join(lines)
    else:
        lines.append(json.dumps({"t": 10.0, "type": "call_end", "reason": "stop", "outcome": "completed"}))
        text = "\n".join(lines) + "\n"
    (directory / "events.jsonl").write_text(text)
    return directory


VALID_CASE = """\
[call]
transport = "twilio"
system_prompt = "Be brief."
greeting = "Hi."

[expect]
turns = 2
voice_to_voice_p95_ms = 2000
not_contains = ["sorry"]

[[turn]]
transcript = "I want to book a table."
golden = "Sure, for when?"  # keep this comment

[[turn]]
transcript = "Tomorrow at seven."
barge_in = true
barge_in_stop_ms = 800
"""


def write_case(directory: Path, toml: str = VALID_CASE, audio: np.ndarray | None = None, rate: int = 8000) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "case.toml").write_text(toml)
    write_wav(directory / "caller.wav", [tone(0.5, rate) if audio is None else audio], rate)
    return directory


def observed(**changes) -> ObservedCall:
    """A two-turn call: the first reply played out, the second cut by the caller; `changes` set its fields."""
    turns = [ObservedTurn(1, "I want to book a table", "Sure, for when?", None, False,
                          {"voice_to_voice": 900.0, "response": 400.0}),
             ObservedTurn(2, "tomorrow at 7", "Booked for tomorrow at", "Booked", True,
                          {"voice_to_voice": 1500.0, "response": 800.0}, stop_ms=600.0)]
    call = ObservedCall("CA1", turns, send_lag_p95_ms=95.0, send_lag_ms=[float(ms) for ms in range(101)])
    for key, value in changes.items():
        setattr(call, key, value)
    return call


def result(tmp_path: Path, name: str, call: ObservedCall) -> CaseResult:
    """The case `write_case` writes under `name`, checked against `call`."""
    case = load_case(write_case(tmp_path / name))
    return CaseResult(case.name, str(case.directory), case.transport, call, check_call(case, call))
