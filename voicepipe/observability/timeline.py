"""A turn's timeline (event -> seconds since the call started) and the figures derived from it."""

from __future__ import annotations

# (figure, from event, to event): each derived figure is the time between two timeline events.
SPANS: tuple[tuple[str, str, str], ...] = (
    ("voice_to_voice", "speech_end", "first_audio_sent"),  # what the caller waits, from their last word
    ("response", "end_of_turn", "first_audio_sent"),  # from the end-of-turn decision
    ("stt_final", "end_of_turn", "final_transcript"),
    ("queue", "llm_queued", "prefill_start"),
    ("ttft", "llm_queued", "first_token"),
    ("first_clause", "end_of_turn", "first_clause"),
    ("tts_first_audio", "first_clause", "first_audio_synth"),
    ("send_delay", "first_audio_synth", "first_audio_sent"),
)

# The events of a normal turn (an interrupted turn ends with "interrupted" instead). All but the first partial
# transcript happen in this order (`CHAIN`); the first partial lies between speech_start and final_transcript:
# while the caller still speaks or, for a short turn, after they stopped.
EVENTS: tuple[str, ...] = (
    "speech_start", "speech_end", "end_of_turn", "first_partial", "final_transcript", "llm_queued",
    "prefill_start", "first_token", "first_clause", "first_audio_synth", "first_audio_sent", "playout_end",
)
CHAIN: tuple[str, ...] = tuple(e for e in EVENTS if e != "first_partial")


def derive_timings(timeline: dict[str, float]) -> dict[str, float]:
    """The derived figures in ms, for the spans whose two ends are both on the timeline."""
    return {name: round((timeline[end] - timeline[start]) * 1000, 1)
            for name, start, end in SPANS if start in timeline and end in timeline}
