"""A turn's timeline (event -> seconds since the call started) and the figures derived from it."""

from __future__ import annotations

# (figure, from event, to event): each derived figure is the time between two timeline events. An early reply
# (calls.preemptive_generation) starts its transcript, LLM and TTS work before the end-of-turn decision; the
# figures in AFTER_END_OF_TURN count only the part of their span after that decision (what the caller waited).
SPANS: tuple[tuple[str, str, str], ...] = (
    ("voice_to_voice", "speech_end", "first_audio_sent"),  # what the caller waits, from their last word
    ("response", "end_of_turn", "first_audio_sent"),  # from the end-of-turn decision
    ("stt_final", "end_of_turn", "final_transcript"),
    ("queue", "llm_queued", "prefill_start"),
    ("ttft", "llm_queued", "first_token"),
    ("first_clause", "end_of_turn", "first_clause"),
    ("tts_first_audio", "first_clause", "first_audio_synth"),
    ("send_delay", "first_audio_synth", "first_audio_sent"),
    ("dtmf_response", "dtmf_end", "first_audio_sent"),  # a keypad turn: from its entry's end (the # key, say)
    ("tool", "tool_call", "tool_result"),  # the reply's first tool call: from the model's call to its result
)

AFTER_END_OF_TURN = frozenset({"stt_final", "first_clause", "tts_first_audio", "send_delay"})

# The events of a normal turn (an interrupted turn ends with "interrupted" instead). All but the first partial
# transcript and the end of turn happen in this order (`CHAIN`). The first partial follows speech_start: while
# the caller still speaks or, for a short turn, after they stopped (even after an early reply's final transcript,
# which the STT worker serves first). The end of turn follows speech_end. The final transcript is requested
# (stt_requested) at the end of turn, or, for an early reply, at the VAD's speech end; then that reply's events
# up to its first audio may come before the end of turn.
EVENTS: tuple[str, ...] = (
    "speech_start", "speech_end", "end_of_turn", "first_partial", "stt_requested", "final_transcript", "llm_queued",
    "prefill_start", "first_token", "first_clause", "first_audio_synth", "first_audio_sent", "playout_end",
)
CHAIN: tuple[str, ...] = tuple(e for e in EVENTS if e not in ("first_partial", "end_of_turn"))
# A keypad turn has no speech: its timeline starts with these (dtmf_end is also its end_of_turn), then goes on as
# a speech turn's does from final_transcript. A reply that calls a tool adds tool_call and tool_result after its
# first_token (the spoken reply's first_clause may come before tool_result: a filler while the tool runs).
KEYPAD_EVENTS: tuple[str, ...] = ("dtmf_start", "dtmf_end")
TOOL_EVENTS: tuple[str, ...] = ("tool_call", "tool_result")


def derive_timings(timeline: dict[str, float]) -> dict[str, float]:
    """The derived figures in ms, for the spans whose two ends are both on the timeline."""
    figures = {}
    eot = timeline.get("end_of_turn")
    for name, start, end in SPANS:
        if start in timeline and end in timeline:
            begin = timeline[start]
            if name in AFTER_END_OF_TURN and eot is not None:
                begin = max(begin, eot)
            figures[name] = round(max(0.0, timeline[end] - begin) * 1000, 1)
    return figures
