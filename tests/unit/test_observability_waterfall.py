"""The waterfall's stages: from a turn's timeline, and from its derived figures when it has no timeline."""

from __future__ import annotations

import re

import pytest

from tests.observability_helpers import decision
from voicepipe.observability.timeline import EVENTS, derive_timings
from voicepipe.observability.waterfall import STAGES, decision_summary, turn_stages, waterfall_svg

# A plausible turn: seconds since the call started for each event, in order.
TIMELINE = dict(zip(EVENTS, [3.0, 4.2, 4.36, 3.5, 4.36, 4.40, 4.40, 4.43, 4.61, 4.85, 4.97, 4.98, 7.5], strict=True))


def test_stages_from_a_timeline_start_at_the_speech_end_and_follow_the_pipeline() -> None:
    segments = turn_stages({"timeline": TIMELINE, "timings_ms": {}})
    assert [s.stage for s in segments] == [key for key, *_ in STAGES if key != "tool"]  # it called no tool
    widths = {s.stage: round(s.ms) for s in segments}
    assert widths == {"end_of_turn": 160, "stt": 40, "queue": 30, "prefill": 180, "first_clause": 240,
                      "tts": 120, "send": 10}
    assert segments[0].start_ms == 0 and segments[-1].end_ms == pytest.approx(780)  # = voice-to-voice


def test_a_tool_call_has_its_stage_and_a_keypad_turn_starts_at_its_entrys_end() -> None:
    timeline = {**TIMELINE, "tool_call": 4.70, "tool_result": 5.90, "first_clause": 4.95, "first_audio_synth": 5.05,
                "first_audio_sent": 5.06}
    tool = next(s for s in turn_stages({"timeline": timeline, "timings_ms": {}}) if s.stage == "tool")
    assert (round(tool.start_ms), round(tool.ms)) == (500, 1200)  # from the caller's speech end at 4.2 s
    keys = {k: v for k, v in TIMELINE.items() if k not in ("speech_start", "speech_end")}
    keys.update(dtmf_start=3.9, dtmf_end=4.36)
    segments = turn_stages({"timeline": keys, "timings_ms": {}})
    assert segments[0].stage == "stt" and segments[0].start_ms == 0  # its end of turn is the # key
    svg = waterfall_svg([{"turn": 1, "dtmf": "42", "timeline": keys, "timings_ms": {}}])
    assert "turn 1 ⌨" in svg


def test_the_figures_alone_give_the_same_stages() -> None:
    from_figures = turn_stages({"timeline": {}, "timings_ms": derive_timings(TIMELINE)})
    from_timeline = turn_stages({"timeline": TIMELINE, "timings_ms": {}})
    assert [(s.stage, round(s.ms)) for s in from_figures] == [(s.stage, round(s.ms)) for s in from_timeline]


def test_missing_events_leave_their_stage_out_and_the_next_starts_where_the_last_ended() -> None:
    partial = {k: v for k, v in TIMELINE.items() if k not in ("llm_queued", "prefill_start", "first_audio_synth")}
    segments = turn_stages({"timeline": partial, "timings_ms": {}})
    assert [s.stage for s in segments] == ["end_of_turn", "stt", "prefill", "first_clause", "send"]
    prefill = segments[2]
    assert prefill.start_ms == pytest.approx(200) and prefill.end_ms == pytest.approx(410)  # from final_transcript


def test_one_bar_group_per_turn_on_one_scale() -> None:
    turns = [{"turn": n, "timeline": {k: v + n * 10 for k, v in TIMELINE.items()}, "timings_ms": {},
              "voice_to_voice_ms": 780.0, "interrupted": n == 2} for n in (1, 2, 3)]
    turns.append({"turn": 4, "timeline": {}, "timings_ms": {}, "voice_to_voice_ms": None})
    svg = waterfall_svg(turns)
    assert svg.count('<g class="turn') == 4 and '<g class="turn interrupted" data-turn="2">' in svg
    assert "turn 2 ⚡ · 780 ms" in svg and "turn 3 · 780 ms" in svg
    assert svg.count('data-stage="prefill"') == 3 and "no timings" in svg


def test_thirty_turns_with_flat_ttft_draw_thirty_aligned_bars_of_one_width() -> None:
    turns = [{"turn": n, "timeline": {k: v + n * 20 for k, v in TIMELINE.items()}, "timings_ms": {},
              "voice_to_voice_ms": 780.0} for n in range(1, 31)]
    svg = waterfall_svg(turns)
    assert svg.count('<g class="turn"') == 30
    prefill = re.findall(r'data-stage="prefill" data-ms="[\d.]+" x="([\d.]+)" y="[\d.]+" width="([\d.]+)"', svg)
    assert len(prefill) == 30 and len(set(prefill)) == 1, set(prefill)  # same start, same width on every row


def test_a_decision_in_a_line_names_only_what_it_has() -> None:
    hybrid, silence = decision(), decision("silence", "no speech for long enough", 612.4, 600.0, None, None)
    assert decision_summary(hybrid) == "hybrid: text and sound say complete · text 0.91 · sound 0.88 · waited 212 ms"
    assert decision_summary(silence) == "silence: no speech for long enough · waited 612 ms"
    assert decision_summary({"policy": "acoustic", "acoustic_prob": float("nan")}) == "acoustic"
    assert decision_summary({}) == ""


def test_a_held_early_reply_waits_as_end_of_turn_wait_and_its_work_is_drawn_inside_that_wait() -> None:
    """An early reply ready 770 ms after the speech end, held by the policy until the end of turn at 1324 ms: the
    wait is the end-of-turn bar, whole; the send bar is the wire's 16 ms, not the hold."""
    held = {**{k: v for k, v in TIMELINE.items() if k != "end_of_turn"}, "end_of_turn": 5.524, "first_audio_sent": 5.54}
    segments = {s.stage: s for s in turn_stages({"timeline": held, "timings_ms": {}})}
    wait, send = segments["end_of_turn"], segments["send"]
    assert (wait.start_ms, round(wait.end_ms), wait.early) == (0, 1324, False)
    assert (round(send.start_ms), round(send.ms), send.early) == (1324, 16, False)
    assert send.ms == pytest.approx(derive_timings(held)["send_delay"])  # the figure the turn reports
    assert [k for k, s in segments.items() if s.early] == ["stt", "queue", "prefill", "first_clause", "tts"]
    assert segments["tts"].end_ms < wait.end_ms  # its first audio was ready long before the policy let it go

    svg = waterfall_svg([{"turn": 1, "timeline": held, "timings_ms": {}}])
    bars = {stage: (float(top), float(height), title) for stage, top, height, title in re.findall(
        r'data-stage="(\w+)" data-ms="[\d.]+" x="[\d.]+" y="([\d.]+)" width="[\d.]+" height="([\d.]+)">'
        r'<title>(.*?)</title>', svg)}
    assert bars["end_of_turn"][:2] == bars["send"][:2] == (24.0, 16.0)  # full height: nothing hides the wait's top
    assert bars["prefill"][:2] == (32.0, 8.0) and bars["prefill"][2].endswith("early reply, before the end of turn")
    assert "end-of-turn wait 1324 ms" in bars["end_of_turn"][2] and "send 16 ms" in bars["send"][2]
