"""The call recorder: stereo WAV placement, clears, incremental validity, events file, per-call switch."""

from __future__ import annotations

import json
import time
import wave
from pathlib import Path

import numpy as np

from tests.observability_helpers import decision
from voicepipe.observability.recorder import RATE, CallRecorder, recording_dir
from voicepipe.observability.records import CallRecord


def record(call_id: str = "CA123", **metadata) -> CallRecord:
    return CallRecord(call_id, "twilio", system_prompt="Be brief.", greeting="Hi.", metadata=metadata)


def read_wav(path: Path) -> np.ndarray:
    with wave.open(str(path)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (2, 2, RATE)
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, 2)


def events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def wait_for(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def caller_chunks(recorder: CallRecorder, call: CallRecord, seconds: float, value: int, t0: float = 0.0) -> float:
    """Feed 20 ms caller chunks arriving at real-time pace from t0; returns the last arrival time."""
    t = t0
    for _ in range(round(seconds / 0.02)):
        t += 0.02
        recorder.audio(call, "caller", np.full(320, value, np.int16), RATE, t)
    return t


def test_channels_are_time_aligned_and_a_clear_removes_unheard_agent_audio(tmp_path: Path) -> None:
    recorder = CallRecorder(tmp_path, record_all=True)
    call = record()
    recorder.call_started(call)
    caller_chunks(recorder, call, 1.0, 1000)
    # The agent's reply goes out at t=1.0 s at the wire's 8 kHz, 0.6 s of audio sent at once (lead),
    # and the caller barges in at t=1.3 s: the last 0.3 s was never heard.
    recorder.audio(call, "agent", np.full(4800, 2000, np.int16), 8000, 1.0)
    caller_chunks(recorder, call, 0.3, 1000, t0=1.0)
    recorder.event(call, {"t": 1.3, "type": "clear"})
    caller_chunks(recorder, call, 0.7, 1000, t0=1.3)
    call.end_reason, call.outcome = "stop", "completed"
    recorder.call_ended(call)
    recorder.close()

    frames = read_wav(tmp_path / "CA123" / "call.wav")
    assert len(frames) == 2 * RATE
    assert np.all(frames[:, 0] == 1000)  # the caller, continuous
    agent = frames[:, 1]
    assert np.all(agent[: RATE - 10] == 0)  # nothing before the reply was sent
    heard = agent[RATE + 400: int(1.3 * RATE) - 10]  # after the resampler's ramp-in
    assert np.all(np.abs(heard.astype(int) - 2000) < 40)
    assert np.all(agent[int(1.3 * RATE):] == 0)  # cut by the clear
    lines = events(tmp_path / "CA123" / "events.jsonl")
    assert lines[0]["type"] == "call_start" and lines[0]["transport"] == "twilio"
    assert lines[0]["system_prompt"] == "Be brief." and lines[0]["sample_rate"] == RATE
    assert [e["type"] for e in lines[1:]] == ["clear", "call_end"]
    assert lines[-1]["outcome"] == "completed"


def test_end_of_turn_decisions_and_reopens_are_written_as_they_come(tmp_path: Path) -> None:
    recorder = CallRecorder(tmp_path, record_all=True)
    call = record()
    recorder.call_started(call)
    reported = [{"t": 1.2, "type": "turn_decision", "turn": 1, **decision("text", "text says complete")},
                {"t": 1.5, "type": "turn_reopened", "turn": 1, "decision": decision("text", "text says complete")},
                {"t": 2.4, "type": "turn_decision", "turn": 1, **decision()}]
    for event in reported:
        recorder.event(call, event)
    recorder.call_ended(call)
    recorder.close()
    assert events(tmp_path / "CA123" / "events.jsonl")[1:-1] == reported


def test_the_files_are_valid_while_the_call_is_still_running(tmp_path: Path) -> None:
    recorder = CallRecorder(tmp_path, record_all=True)
    call = record("live")
    recorder.call_started(call)
    recorder.event(call, {"t": 0.01, "type": "vad", "kind": "speech_start"})
    caller_chunks(recorder, call, 2.0, 500)
    # Nothing is closed: a crash now must still leave a readable WAV and JSONL, at most ~1 s behind.
    wav = tmp_path / "live" / "call.wav"
    wait_for(lambda: wav.exists() and len(read_wav(wav)) >= int(1.0 * RATE))
    assert np.all(read_wav(wav)[:, 0] == 500)
    wait_for(lambda: len(events(tmp_path / "live" / "events.jsonl")) == 2)
    recorder.close()
    assert len(read_wav(wav)) == 2 * RATE  # close writes out everything


def test_only_calls_asked_for_are_recorded(tmp_path: Path) -> None:
    recorder = CallRecorder(tmp_path, record_all=False)
    quiet, loud = record("quiet"), record("loud", record="true")
    for call in (quiet, loud):
        recorder.call_started(call)
        caller_chunks(recorder, call, 0.1, 1)
        recorder.call_ended(call)
    recorder.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loud"]

    recorder = CallRecorder(tmp_path / "all", record_all=True)
    recorder.call_started(record("off", record="0"))
    recorder.close()
    assert not (tmp_path / "all").exists()


def test_a_call_id_cannot_escape_the_recordings_directory(tmp_path: Path) -> None:
    for hostile in ("../../etc/passwd", "/abs/path", "..", ""):
        path = recording_dir(tmp_path, hostile)
        assert path.parent == tmp_path and path.name not in ("", ".", "..")
