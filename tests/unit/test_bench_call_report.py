"""`voicepipe bench call`'s report from finished calls (no server: the client's turns and the server's records)."""

from __future__ import annotations

from voicepipe.bench.call import (
    SENTENCES,
    WINDOW,
    WINDOW_RATIO,
    loop_lag_summary,
    parse_loop_lag,
    policy_ratios,
    sentence_of_turn,
    summarize_run,
)
from voicepipe.bench.remote import remote_ratios
from voicepipe.caller import CallResult, ClientTurn
from voicepipe.observability.metrics import Metrics


def call(call_id: str, ttft: dict[int, float], no_reply: set[int] = frozenset(), empty: set[int] = frozenset(),
         turns: int = 30) -> CallResult:
    result = CallResult("twilio", call_id)
    records = []
    for k in range(1, turns + 1):
        replied = k not in no_reply
        result.turns.append(ClientTurn(k, speech_end=10.0 * k, first_audio=10.0 * k + 0.5 if replied else None))
        records.append({"turn": k, "user_text": "" if k in empty else "hello", "error": None, "interrupted": False,
                        "timings_ms": {"response": 20.0, "ttft": ttft.get(k, 100.0), "stt_final": 30.0 + k,
                                       "voice_to_voice": 420.0}
                        if replied else {},
                        "timeline": {"speech_end": 10.0 * k, "end_of_turn": 10.0 * k + 0.25},
                        "prompt_tokens": 100 * k, "cached_prompt_tokens": 100 * k - 20})
    result.record = {"turns": records}
    return result


def test_turn_30_and_each_window_say_the_same_sentences_as_the_early_turns() -> None:
    assert sentence_of_turn(30) == sentence_of_turn(2)
    late, early = range(24, 31), range(2, 2 + WINDOW)
    assert sorted(map(sentence_of_turn, late)) == sorted(map(sentence_of_turn, early)) == sorted(SENTENCES)
    assert WINDOW_RATIO == "ttft_last7_over_turns2to8"


def test_report_pools_calls_and_gives_turn_and_window_ratios() -> None:
    # TTFT 100 ms everywhere, except turn 2 (80 in one call, 120 in the other) and the last seven turns (150)
    late = {k: 150.0 for k in range(24, 31)}
    a = call("CA1", {2: 80.0, **late}, no_reply={9}, empty={9})
    b = call("CA2", {2: 120.0, **late})
    report = summarize_run([a, b], turns=30, seconds=12.34)
    assert report["calls"] == 2 and report["seconds"] == 12.3
    assert report["voice_to_voice_ms"]["p50"] == 500.0 and report["voice_to_voice_ms"]["n"] == 59
    assert report["response_ms"]["n"] == 59
    assert report["ttft_turn30_over_turn2"] == 1.5  # 150 / median(80, 120)
    # turns 2-8 pooled: 80, 120 and twelve 100s -> 100; turns 24-30: 150
    assert report[WINDOW_RATIO] == 1.5
    assert report["turns_without_reply"] == 1
    assert report["turn_problems"] == [{"call": "CA1", "turn": 9, "user_text": "", "error": None,
                                        "interrupted": False}]
    turn2 = next(row for row in report["per_turn"] if row["turn"] == 2)
    assert turn2["ttft_ms_p50"] == 100.0
    stages = report["stages_ms"]
    assert stages["stt_final"]["n"] == 59 and stages["stt_final"]["p50"] == 46.0  # 31..60 twice, less one 39
    assert stages["end_of_turn_wait"]["p50"] == 250.0 and stages["end_of_turn_wait"]["n"] == 60  # turn 9 too
    assert stages["tts_first_audio"]["n"] == 0
    assert stages["outside_server"]["p50"] == 80.0 and stages["outside_server"]["n"] == 59  # 500 on the client


def test_short_runs_have_no_turn30_or_window_ratio() -> None:
    report = summarize_run([call("CA1", {2: 50.0, 8: 100.0}, turns=8)], turns=8, seconds=1.0)
    assert report["ttft_turn8_over_turn2"] == 2.0
    assert report["ttft_turn30_over_turn2"] is None and report[WINDOW_RATIO] is None


def test_the_policy_ratio_divides_the_default_policys_voice_to_voice_by_silences_at_the_same_n():
    def run(calls, policy, p50):
        return {"calls": calls, "policy": policy, "voice_to_voice_ms": {"p50": p50}}

    runs = [run(1, "silence", 800.0), run(1, "hybrid", 520.0), run(4, "silence", 1800.0), run(4, "hybrid", 1500.0)]
    assert policy_ratios(runs, "hybrid") == {"voice_to_voice_ratio": 0.65,
                                             "voice_to_voice_ratio_by_calls": {"1": 0.65, "4": 0.833}}
    assert policy_ratios([run(4, "silence", 1000.0), run(4, "hybrid", None)], "hybrid")["voice_to_voice_ratio"] is None


def test_the_cached_fraction_counts_from_turn_2_and_remote_runs_compare_with_local_ones() -> None:
    run = summarize_run([call("CA1", {}, turns=5)], 5, 60.0)
    assert run["cached_fraction_from_turn2"] == {"min": 0.9, "p50": 0.942}  # 180/200 .. 480/500, turn 1 left out
    local = {"concurrency": 1, "voice_to_voice_ms": {"p50": 1000.0}, "cached_fraction_from_turn2": {"min": 0.95}}
    remote = {"concurrency": 1, "voice_to_voice_ms": {"p50": 1150.0}, "cached_fraction_from_turn2": {"min": 0.91}}
    ratios = remote_ratios([local], [remote])
    assert ratios["remote_over_local_v2v"] == 1.15 and ratios["remote_cached_fraction"] == {"min": 0.91}


def test_a_runs_event_loop_lag_is_what_it_added_to_the_servers_histogram() -> None:
    metrics = Metrics()

    def counts() -> dict[float, float] | None:
        return parse_loop_lag(metrics.render()[0].decode())

    metrics.loop_lag.observe(2.0)  # before the run: not its own
    before = counts()
    for lag in (0.0004, 0.003, 0.08, 0.3, 0.7):
        metrics.loop_lag.observe(lag)
    assert loop_lag_summary(before, counts()) == {"samples": 5, "late": 2, "worst_ms_at_most": 1000.0}
    metrics.loop_lag.observe(9.0)
    assert loop_lag_summary(before, counts())["worst_ms_at_most"] is None  # beyond the last finite bound
    assert loop_lag_summary(counts(), counts()) == {"samples": 0, "late": 0, "worst_ms_at_most": 0.0}
    assert loop_lag_summary(None, counts()) is None  # a server without /metrics
