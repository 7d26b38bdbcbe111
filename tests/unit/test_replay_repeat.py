"""`replay --repeat N`: each case's runs compared with the first (turns, transcripts, barge-ins, reopens, replies
that played out), every difference named, voice-to-voice's spread reported; and the command's JSON."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from tests.cli_helpers import run_cli
from tests.net_helpers import free_port
from tests.replay_fixtures import observed, result, write_case
from voicepipe.replay.observed import ObservedTurn
from voicepipe.replay.repeat import Difference, differences, repeated_result
from voicepipe.replay.reports import write_reports
from voicepipe.replay.results import report_dict


def test_identical_runs_have_no_differences_and_the_wall_clock_is_not_compared() -> None:
    slower = observed()
    slower.turns[0].timings_ms["voice_to_voice"] = 2500.0
    slower.turns[1].agent_text = "Booked for tomorrow at seven"  # cut later by the caller: not compared
    assert differences([observed(), observed(), slower]) == []


def test_each_compared_field_that_differs_is_named_with_its_run_turn_and_both_values() -> None:
    cut = observed()
    cut.turns[0].user_text, cut.turns[0].reopened = "I want to book a cable", 1
    extra = observed()
    extra.turns[0].agent_text = "Of course.  When?"
    extra.turns.append(ObservedTurn(3, "to make", "Sure."))
    played = observed()
    played.turns[1].interrupted = False
    assert differences([observed(), cut, extra, played, observed(error="TimeoutError")]) == [
        Difference(2, 1, "user_text", "'I want to book a table'", "'I want to book a cable'"),
        Difference(2, 1, "reopened", "0", "1"),
        Difference(3, None, "turns", "2", "3"),
        Difference(3, 1, "agent_text", "'Sure, for when?'", "'Of course. When?'"),
        Difference(4, 2, "barge_in", "True", "False"),
        Difference(5, None, "error", "None", "TimeoutError"),
    ]


def test_a_case_whose_runs_differ_fails_naming_what_differed_in_every_report(tmp_path: Path) -> None:
    other = observed()
    other.turns[0].agent_text = "Of course. When?"
    other.turns[0].timings_ms["voice_to_voice"] = 1300.0
    other.send_lag_ms = [1000.0] * 101  # the replay's own timing: late in the third run
    runs = [result(tmp_path, "book", call) for call in (observed(), observed(), other)]
    same = repeated_result([result(tmp_path, "calm", observed()) for _ in range(3)])
    merged = repeated_result(runs)
    assert same.passed and [c.name for c in same.checks if c.name.startswith("same")] == ["same_in_every_run"]
    assert not merged.passed and merged.repeat["same"] is False and merged.repeat["runs_passed"] == 2
    diff = [c for c in merged.checks if not c.passed]
    assert [(c.turn, c.name, c.expected, c.actual) for c in diff] == [
        (1, "run 3: golden", "'Sure, for when?' (WER <= 0.5)", "'Of course. When?' (WER 0.67)"),  # its own check
        (1, "same_agent_text", "run 1: 'Sure, for when?'", "run 3: 'Of course. When?'")]
    assert merged.repeat["voice_to_voice_ms"] == {"min": 900.0, "median": 1400.0, "max": 1500.0, "n": 6}
    assert merged.repeat["voice_to_voice_ms_by_turn"][0] == {"turn": 1, "min": 900.0, "median": 900.0,
                                                             "max": 1300.0, "n": 3}

    report = report_dict([merged, same], 30.0, repeat=3, cpu_load=1)
    paths = write_reports(report, [merged, same], tmp_path / "out")
    data = json.loads(paths["json"].read_text())
    assert (data["repeat"], data["cpu_load"], data["cases_failed"], data["cases_differing"]) == (3, 1, 1, 1)
    assert data["send_lag_p95_ms"] == 1000.0  # over every caller frame of every run
    book = data["cases"][0]
    assert book["repeat"]["differences"] == [{"run": 3, "turn": 1, "field": "agent_text",
                                              "first": "'Sure, for when?'", "other": "'Of course. When?'"}]
    assert [run["turns"][0]["agent_text"] for run in book["repeat"]["each_run"]] == ["Sure, for when?"] * 2 + [
        "Of course. When?"]
    summary = paths["markdown"].read_text()
    assert "| **FAIL** | book | 1 | run 3: golden<br>same_agent_text |" in summary
    assert "run 1: 'Sure, for when?'" in summary and "run 3: 'Of course. When?'" in summary
    assert "| book | **no**: 1 difference | 2/3 | 900 / 1400 / 1500 |" in summary
    assert "| calm | yes | 3/3 | 900 / 1200 / 1500 |" in summary
    failure = ET.parse(paths["junit"]).getroot().find("testsuite/testcase[@name='book']/failure")
    assert "turn 1 same_agent_text: expected run 1: 'Sure, for when?', got run 3: 'Of course. When?'" in failure.text


def test_the_command_repeats_each_case_beside_the_cpu_load_and_writes_it_in_its_json(tmp_path: Path) -> None:
    directory = write_case(tmp_path / "book")
    proc = run_cli("replay", str(directory), "--url", f"http://127.0.0.1:{free_port()}", "--repeat", "2",
                   "--cpu-load", "1", "--report-dir", str(tmp_path / "out"))
    assert proc.returncode == 1, proc.stdout + proc.stderr  # no server there: every run fails the same way
    assert "[run 2/2] replaying book" in proc.stdout and "| book | yes | 0/2 |" in proc.stdout
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert (data["repeat"], data["cpu_load"], data["cases_differing"]) == (2, 1, 0)
    assert len(data["cases"][0]["repeat"]["each_run"]) == 2
    golden = run_cli("replay", str(directory), "--repeat", "2", "--update-golden")
    assert golden.returncode == 2 and "--update-golden rewrites the golden text from one run" in golden.stderr
