"""The expectations checked against an observed call, the baseline comparison, the reports and --update-golden."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

from tests.replay_fixtures import observed, result, write_case
from voicepipe.replay.case import load_case
from voicepipe.replay.checks import check_call
from voicepipe.replay.golden import update_golden
from voicepipe.replay.observed import ObservedTurn, speech_onsets, stop_latencies_ms
from voicepipe.replay.reports import markdown_summary, rows, write_reports
from voicepipe.replay.results import baseline_checks, load_baseline, report_dict


def failed(checks) -> list[tuple[int | None, str]]:
    return [(c.turn, c.name) for c in checks if not c.passed]


def test_a_call_that_meets_every_expectation_passes(tmp_path: Path) -> None:
    checks = check_call(load_case(write_case(tmp_path / "c")), observed())
    assert failed(checks) == []
    names = {(c.turn, c.name) for c in checks}
    assert {(None, "turns"), (None, "voice_to_voice_p95_ms"), (1, "transcript"), (1, "golden"),
            (1, "not_contains"), (2, "barge_in"), (2, "barge_in_stop_ms")} <= names
    assert (2, "golden") not in names  # an interrupted reply has no golden text


def test_each_kind_of_regression_fails_its_check(tmp_path: Path) -> None:
    case = load_case(write_case(tmp_path / "c"))
    call = observed()
    call.turns[0].user_text = "I want to cook a cable"
    call.turns[0].agent_text = "Sorry, we are closed tonight."
    call.turns[1].stop_ms = 1200.0
    call.turns[1].timings_ms["voice_to_voice"] = 5000.0
    assert failed(check_call(case, call)) == [(None, "voice_to_voice_p95_ms"), (1, "transcript"), (1, "golden"),
                                              (1, "not_contains"), (2, "barge_in_stop_ms")]
    call = observed()
    call.turns[1].interrupted = False
    call.turns.append(ObservedTurn(3, "", ""))
    assert failed(check_call(case, call)) == [(None, "turns"), (2, "barge_in"), (3, "extra_turn")]
    assert failed(check_call(case, observed(turns=[]))) == [(None, "turns"), (1, "turn"), (2, "turn")]
    assert failed(check_call(case, observed(error="ConnectionRefusedError"))) == [(None, "call")]


def test_reply_checks_contains_regex_and_length(tmp_path: Path) -> None:
    toml = ('[call]\ntransport = "native"\n[expect]\nmax_chars = 20\n'
            '[[turn]]\ntranscript = "I want to book a table"\ncontains = ["WHEN"]\nregex = ["^Sure"]\n'
            'not_contains = ["closed"]\n[[turn]]\ntranscript = "tomorrow at 7"\n')
    case = load_case(write_case(tmp_path / "c", toml))
    assert failed(check_call(case, observed())) == [(2, "max_chars")]  # 'Booked for tomorrow at' is 22
    call = observed()
    call.turns[0].agent_text = "When? Sure."
    assert failed(check_call(case, call)) == [(1, "regex"), (2, "max_chars")]


def test_speech_onsets_and_the_stop_time_of_a_barge_in() -> None:
    rate = 8000
    loud = (np.sin(np.arange(rate // 2) / 3) * 6000).astype(np.int16)
    quiet = np.zeros(rate, np.int16)
    audio = np.concatenate([quiet, loud, quiet[: rate // 10], loud, quiet, loud])  # a 100 ms gap joins two
    assert speech_onsets(audio, rate) == [1.0, 3.1]
    noisy = audio + np.random.default_rng(0).normal(0, 800, len(audio)).astype(np.int16)  # a floor over 300
    assert [round(o, 2) for o in speech_onsets(noisy, rate)] == [1.0, 3.1]
    assert stop_latencies_ms([10.0, 20.0], [9.0, 10.5, 20.25]) == [None, 500.0, 250.0]


def test_a_baseline_flags_slowdowns_beyond_the_tolerance() -> None:
    base = {"voice_to_voice_p95_ms": 1000.0, "response_p95_ms": 500.0}
    now = {"voice_to_voice_p95_ms": 1300.0, "response_p95_ms": 580.0}
    checks = baseline_checks(now, base, tolerance=0.25, floor_ms=100)
    assert [(c.name, c.passed) for c in checks] == [("baseline_voice_to_voice_p95_ms", False),
                                                    ("baseline_response_p95_ms", True)]  # +80 ms < the floor
    assert baseline_checks(now, None, 0.25, 100) == []


def test_reports_put_failures_first_and_round_trip_as_a_baseline(tmp_path: Path) -> None:
    bad = observed()
    bad.turns[0].agent_text = "Sorry, no."
    results = [result(tmp_path, "good", observed()), result(tmp_path, "bad", bad)]
    report = report_dict(results, 12.5, url="in-process", seed=None, concurrency=1)
    paths = write_reports(report, results, tmp_path / "out")
    table = rows(results)
    assert [(r[0], r[1], r[2]) for r in table[:1]] == [(False, "bad", "1")]
    assert all(r[0] for r in table[1:])
    summary = paths["markdown"].read_text()
    assert summary.startswith("# voicepipe replay: 1 passed, 1 failed") and summary == markdown_summary(report, results)
    assert "| **FAIL** | bad | 1 | golden<br>not_contains |" in summary and "'Sorry, no.'" in summary
    assert "| pass | good | 2 | transcript |" in summary and summary.rstrip().endswith("| Booked [cut] |")
    suite = ET.parse(paths["junit"]).getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures")) == ("2", "1")
    failure = suite.find("testcase[@name='bad']/failure")
    assert "turn 1 not_contains: expected not 'sorry'" in failure.text
    data = json.loads(paths["json"].read_text())
    assert (data["cases_passed"], data["cases_failed"], data["send_lag_p95_ms"]) == (1, 1, 95.0)  # over all frames
    assert "send_lag_ms" not in data["cases"][0] and data["cases"][0]["metrics"]["send_lag_p95_ms"] == 95.0
    assert load_baseline(paths["json"])["good"]["voice_to_voice_p95_ms"] == 1470.0


def test_update_golden_rewrites_deterministic_cases_only_and_keeps_comments(tmp_path: Path) -> None:
    directory = write_case(tmp_path / "c")
    call = observed()
    call.turns[0].agent_text = 'Of course! For "when"?'
    diff = update_golden(load_case(directory), call)
    assert '-golden = "Sure, for when?"  # keep this comment' in diff
    assert '+golden = "Of course! For \\"when\\"?"' in diff
    case = load_case(directory)
    assert case.expected_turns[0].golden == 'Of course! For "when"?' and case.expected_turns[1].golden is None
    assert "# keep" not in (directory / "case.toml").read_text()  # the replaced line's comment goes with it
    assert update_golden(case, call) == ""  # nothing left to change

    sampled = write_case(tmp_path / "s", (directory / "case.toml").read_text().replace(
        'greeting = "Hi."', 'greeting = "Hi."\ndeterministic = false'))
    assert update_golden(load_case(sampled), observed()) == ""


def test_update_golden_adds_a_missing_golden_line(tmp_path: Path) -> None:
    toml = '[call]\ntransport = "native"\n\n[[turn]]  # the first\ntranscript = "hi"\n\n[expect]\nturns = 1\n'
    directory = write_case(tmp_path / "c", toml)
    update_golden(load_case(directory), observed(turns=observed().turns[:1]))
    text = (directory / "case.toml").read_text()
    assert '[[turn]]  # the first\ngolden = "Sure, for when?"\ntranscript = "hi"\n' in text
    assert load_case(directory).turns == 1
