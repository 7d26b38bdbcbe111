"""Reading a call recording (`recordings/<call_id>/`: `call.wav` stereo, caller left, agent right; `events.jsonl`).

A recording cut short by a crash (no `call_end`, a truncated last line) is still read: lines that are not
JSON objects are skipped and counted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from voicepipe.errors import VoicepipeError
from voicepipe.replay.audio import AudioFileError, read_channels


@dataclass
class Recording:
    directory: Path
    call_start: dict[str, Any]
    events: list[dict[str, Any]]
    caller: np.ndarray  # int16, the left channel of call.wav
    rate: int
    agent: np.ndarray | None = None  # int16, the right channel (the agent's audio as sent), where there is one
    skipped_lines: int = 0
    turns: list[dict[str, Any]] = field(default_factory=list)  # the `turn` events, in order
    call_end: dict[str, Any] | None = None


def read_events(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The event objects of an events.jsonl file, and how many lines could not be read."""
    events, skipped = [], 0
    with path.open("rb") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                skipped += 1
                continue
            if isinstance(event, dict) and isinstance(event.get("type"), str):
                events.append(event)
            else:
                skipped += 1
    return events, skipped


def load_recording(directory: Path) -> Recording:
    directory = Path(directory)
    events_path, wav_path = directory / "events.jsonl", directory / "call.wav"
    for path in (events_path, wav_path):
        if not path.is_file():
            raise VoicepipeError(f"{path}: missing; a recording directory holds call.wav and events.jsonl.",
                                 "pass a directory under the recordings directory (paths.recordings_dir).")
    events, skipped = read_events(events_path)
    if not events or events[0]["type"] != "call_start":
        raise VoicepipeError(f"{events_path}: the first event is not call_start; this is not a voicepipe recording.")
    try:
        channels, rate = read_channels(wav_path)
    except AudioFileError as exc:
        raise VoicepipeError(f"{wav_path}: {exc}.") from None
    turns = sorted((e for e in events if e["type"] == "turn" and isinstance(e.get("turn"), int)),
                   key=lambda e: e["turn"])
    end = next((e for e in reversed(events) if e["type"] == "call_end"), None)
    return Recording(directory, events[0], events, channels[0], rate, channels[1] if len(channels) > 1 else None,
                     skipped, turns, end)


def arrival_lag_ms(events: list[dict[str, Any]]) -> list[float]:
    """How late each caller frame reached the server against real time (from the `inbound` events): its arrival
    minus the time its first sample was due, given the first frame's arrival and the audio before it, less the
    smallest such offset (the frame that arrived most on time sets the clock)."""
    offsets, due = [], 0.0
    for event in events:
        if event["type"] != "inbound" or not isinstance(event.get("rate"), int) or event["rate"] <= 0:
            continue
        offsets.append(event["t"] - due)
        due += event.get("samples", 0) / event["rate"]
    if not offsets:
        return []
    best = min(offsets)
    return [(o - best) * 1000 for o in offsets]
