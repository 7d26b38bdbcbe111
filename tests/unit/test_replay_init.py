"""Recordings (complete or cut short by a crash) and `replay init`: a case pre-filled from the recorded run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.cli_helpers import run_cli
from tests.replay_fixtures import RATE, tone, write_recording
from voicepipe.errors import VoicepipeError
from voicepipe.replay.case import load_case
from voicepipe.replay.init_case import budget_ms, init_case, toml_value
from voicepipe.replay.recording import arrival_lag_ms, load_recording


def test_a_recording_cut_short_by_a_crash_is_still_read(tmp_path: Path) -> None:
    rec = load_recording(write_recording(tmp_path / "CA1", truncated=True))
    assert rec.call_start["transport"] == "twilio" and rec.call_end is None and rec.skipped_lines == 1
    assert [t["turn"] for t in rec.turns] == [1, 2] and rec.rate == RATE
    assert np.array_equal(rec.caller[RATE: 2 * RATE], tone(1.0))  # the left channel


def test_a_complete_recording_has_its_call_end(tmp_path: Path) -> None:
    rec = load_recording(write_recording(tmp_path / "CA1"))
    assert rec.call_end["outcome"] == "completed" and rec.skipped_lines == 0


def test_init_prefills_the_expectations_from_the_run(tmp_path: Path) -> None:
    out = init_case(write_recording(tmp_path / "CA1", truncated=True), tmp_path / "case")
    case = load_case(out)
    assert (case.transport, case.system_prompt, case.greeting, case.turns) == ("twilio", "Be brief.", "Hi there.", 2)
    assert case.voice_to_voice_p95_ms == budget_ms([900.0, 1100.0]) and case.response_p95_ms == budget_ms([500, 700])
    first, second = case.expected_turns
    assert (first.transcript, first.golden, first.barge_in) == ("I want to book a table.", "Sure, for when?", False)
    assert (second.transcript, second.golden, second.barge_in) == ("Tomorrow at seven.", None, True)
    assert second.barge_in_stop_ms == budget_ms([400.0])  # the clear came 400 ms after the caller spoke
    assert case.rate == RATE and np.array_equal(case.audio[RATE: 2 * RATE], tone(1.0))


def test_the_callers_keys_are_kept_at_their_times(tmp_path: Path) -> None:
    keys = ((8.1234, "4"), (8.35, "#"))
    case = load_case(init_case(write_recording(tmp_path / "CA1", keys=keys), tmp_path / "case"))
    assert case.keys == [(8.123, "4"), (8.35, "#")]
    assert load_case(init_case(write_recording(tmp_path / "CA2"), tmp_path / "case2")).keys == []


def test_no_greeting_is_kept_as_none(tmp_path: Path) -> None:
    case = load_case(init_case(write_recording(tmp_path / "CA1", greeting=None), tmp_path / "case"))
    assert case.greeting == ""


def test_init_refuses_what_it_cannot_use(tmp_path: Path) -> None:
    with pytest.raises(VoicepipeError, match="events.jsonl: missing"):
        init_case(tmp_path, tmp_path / "case")
    with pytest.raises(VoicepipeError, match="'audiosocket'"):
        init_case(write_recording(tmp_path / "A", transport="audiosocket"), tmp_path / "case")
    rec = write_recording(tmp_path / "B")
    init_case(rec, tmp_path / "case")
    with pytest.raises(VoicepipeError, match="already exists"):
        init_case(rec, tmp_path / "case")


def test_budgets_have_headroom() -> None:
    assert budget_ms([]) is None
    assert budget_ms([400.0]) == 1400  # +1000 ms
    assert budget_ms([2000.0, 3000.0]) == 5900  # x2 of the p95 (2950)


def test_toml_values_round_trip() -> None:
    import tomllib

    text = 'quote " back \\ newline \n tab \t del \x7f émoji 🎉'
    data = tomllib.loads(f"a = {toml_value(text)}\nb = {toml_value([1, 2.5, True, 'x'])}\n")
    assert data == {"a": text, "b": [1, 2.5, True, "x"]}


def test_the_init_command_writes_the_case(tmp_path: Path) -> None:
    rec = write_recording(tmp_path / "CA9")
    proc = run_cli("replay", "init", str(rec), "--out", str(tmp_path / "case"))
    assert proc.returncode == 0, proc.stderr
    assert "case written to" in proc.stdout and load_case(tmp_path / "case").turns == 2
    proc = run_cli("replay", "init", str(tmp_path / "nothing"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_arrival_lag_is_measured_against_real_time() -> None:
    events = [{"type": "call_start", "t": 0}] + [
        {"type": "inbound", "t": t, "samples": 160, "rate": 8000} for t in (0.10, 0.12, 0.15, 0.16, 0.18)]
    assert [round(x) for x in arrival_lag_ms(events)] == [0, 0, 10, 0, 0]
    assert arrival_lag_ms([{"type": "vad", "t": 1.0}]) == []
