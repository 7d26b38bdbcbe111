"""A call's per-turn latency waterfall: where each turn's wait went, stage by stage, as server-side SVG.

`turn_stages()` is pure: it places each stage of one stored turn on a time axis that starts when the caller
stopped speaking (ms). It reads the turn's timeline (seconds since the call started; keys in
`observability/hooks.py`) and falls back to the derived figures (`timings_ms`) for turns stored without
one. An early reply (calls.preemptive_generation) works while the end-of-turn policy still waits: its stages that
start before the end of turn are drawn `early`, as thin bars inside the end-of-turn wait, which is drawn whole. Its
audio is held until the end of turn, so its send stage starts there: the time its first audio waited before that is
the policy's, not the wire's.
`waterfall_svg()` draws one `<g class="turn" data-turn="N">` row per turn on a scale shared by every row,
so a flat (or growing) TTFT across 30 turns shows at a glance; the end-of-turn wait's tooltip says what the
turn's end-of-turn decision saw (`decision_summary()`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import Any

# (key, label, start event, end event), in pipeline order. A missing start event starts the stage where the
# previous one ended; a missing end event leaves the stage out.
STAGES: list[tuple[str, str, str, str]] = [
    ("end_of_turn", "end-of-turn wait", "speech_end", "end_of_turn"),
    ("stt", "STT final transcript", "stt_requested", "final_transcript"),
    ("queue", "LLM queue", "llm_queued", "prefill_start"),
    ("prefill", "prefill → first token (TTFT)", "prefill_start", "first_token"),
    ("tool", "tool call", "tool_call", "tool_result"),  # a reply that called a tool: its first call
    ("first_clause", "first clause", "first_token", "first_clause"),
    ("tts", "TTS first audio", "first_clause", "first_audio_synth"),
    ("send", "send", "first_audio_synth", "first_audio_sent"),
]
LABELS = {key: label for key, label, _, _ in STAGES}
EARLY = "early reply, before the end of turn"


@dataclass(frozen=True)
class Segment:
    stage: str
    start_ms: float  # since the caller stopped speaking
    end_ms: float
    early: bool = False  # an early reply's work, started before the end of turn

    @property
    def ms(self) -> float:
        return self.end_ms - self.start_ms


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def turn_stages(turn: dict[str, Any]) -> list[Segment]:
    """The stages of one turn (a stored turn: `timeline` and `timings_ms` dicts)."""
    timeline = {k: v for k, v in (turn.get("timeline") or {}).items() if _number(v) is not None}
    origin = timeline.get("speech_end", timeline.get("end_of_turn"))
    if origin is not None and any(end in timeline for _, _, _, end in STAGES[1:]):
        return _from_timeline(timeline, origin)
    return _from_figures(turn.get("timings_ms") or {})


def _from_timeline(timeline: dict[str, float], origin: float) -> list[Segment]:
    segments, previous_end = [], origin
    end_of_turn = timeline.get("end_of_turn", origin)
    for key, _, start_event, end_event in STAGES:
        if end_event not in timeline or key == "end_of_turn" and start_event not in timeline:  # a keypad turn's
            continue
        start = timeline.get(start_event, previous_end)
        if key == "send":
            start = max(start, end_of_turn)  # an early reply's audio is held until the end of turn
        end = timeline[end_event]
        if end >= start:
            early = key != "end_of_turn" and start < end_of_turn
            segments.append(Segment(key, (start - origin) * 1000, (end - origin) * 1000, early))
            previous_end = end
    return segments


def _from_figures(ms: dict[str, Any]) -> list[Segment]:
    """Stages laid end to end from the derived figures (no timeline stored)."""
    figure = {k: v for k, v in ((k, _number(v)) for k, v in ms.items()) if v is not None}
    widths: list[tuple[str, float | None]] = [
        ("end_of_turn", figure["voice_to_voice"] - figure["response"]
         if "voice_to_voice" in figure and "response" in figure else None),
        ("stt", figure.get("stt_final")),
        ("queue", figure.get("queue")),
        ("prefill", figure["ttft"] - figure.get("queue", 0.0) if "ttft" in figure else None),  # ttft holds the queue
        ("first_clause", figure["first_clause"] - figure.get("stt_final", 0.0) - figure.get("ttft", 0.0)
         if "first_clause" in figure else None),
        ("tts", figure.get("tts_first_audio")),
        ("send", figure.get("send_delay")),
    ]
    segments, at = [], 0.0
    for key, width in widths:
        if width is not None and width > 0:
            segments.append(Segment(key, at, at + width))
            at += width
    return segments


def decision_summary(decision: dict[str, Any]) -> str:
    """An end-of-turn decision in a line: "hybrid: text and sound say complete · text 0.91 · sound 0.88 · waited
    212 ms" ("" for none)."""
    head = ": ".join(str(decision[key]) for key in ("policy", "reason") if decision.get(key))
    parts = [head] if head else []
    for key, name in (("text_prob", "text"), ("acoustic_prob", "sound")):
        prob = _number(decision.get(key))
        if prob is not None:
            parts.append(f"{name} {prob:.2f}")
    waited = _number(decision.get("silence_ms"))
    if waited is not None:
        parts.append(f"waited {waited:.0f} ms")
    return " · ".join(parts)


def _stage_title(turn: dict[str, Any], s: Segment) -> str:
    """A bar's tooltip; the end-of-turn wait's also says what decided it and how often the caller reopened it."""
    title = f"turn {int(turn['turn'])}: {LABELS[s.stage]} {s.ms:.0f} ms"
    if s.early:
        return f"{title}, {EARLY}"
    if s.stage != "end_of_turn":
        return title
    reopens = len(turn.get("reopened") or [])
    notes = [decision_summary(turn.get("decision") or {}), f"reopened ×{reopens}" if reopens else ""]
    note = " · ".join(n for n in notes if n)
    return f"{title} — {note}" if note else title


def _tick_step(span_ms: float) -> float:
    """A round step giving 4-10 ticks over `span_ms`."""
    raw = max(span_ms, 1.0) / 6
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def waterfall_svg(turns: list[dict[str, Any]], width: int = 960) -> str:
    """One row per turn, the stages stacked along a shared ms axis; hover a bar for its stage and duration."""
    label_w, row_h, bar_h, top, right = 120, 24, 16, 24, 40
    rows = [(t, turn_stages(t)) for t in turns]
    span = max([s.end_ms for _, segs in rows for s in segs] + [_number(t.get("voice_to_voice_ms")) or 0.0
                                                               for t, _ in rows] + [1.0])
    step = _tick_step(span)
    span = math.ceil(span / step) * step
    plot_w = width - label_w - right
    height = top + row_h * max(len(rows), 1) + 8

    def x(ms: float) -> float:
        return label_w + ms / span * plot_w

    out = [f'<svg class="waterfall" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="per-turn latency waterfall">']
    tick = 0.0
    while tick <= span + 1e-9:
        out.append(f'<line class="tick" x1="{x(tick):.1f}" x2="{x(tick):.1f}" y1="{top - 4}" y2="{height - 8}"/>'
                   f'<text class="tick-label" x="{x(tick):.1f}" y="{top - 8}">{tick:g} ms</text>')
        tick += step
    for i, (turn, segments) in enumerate(rows):
        y = top + i * row_h
        classes = "turn interrupted" if turn.get("interrupted") else "turn"
        v2v = _number(turn.get("voice_to_voice_ms"))
        label = (f"turn {turn['turn']}" + (" ⚡" if turn.get("interrupted") else "")  # ⚡: the caller barged in
                 + (" ⌨" if turn.get("dtmf") else "")  # ⌨: a keypad turn
                 + (f" · {v2v:.0f} ms" if v2v is not None else ""))
        out.append(f'<g class="{classes}" data-turn="{int(turn["turn"])}">'
                   f'<text class="turn-label" x="4" y="{y + bar_h - 3}">{escape(label)}</text>')
        for s in segments:
            # early work: the lower half of the row, over the end-of-turn wait it ran in
            top_y, h, early = (y + bar_h / 2, bar_h / 2, " early") if s.early else (y, bar_h, "")
            out.append(f'<rect class="stage stage-{s.stage}{early}" data-stage="{s.stage}" data-ms="{s.ms:.1f}" '
                       f'x="{x(s.start_ms):.1f}" y="{top_y:g}" width="{max(s.ms / span * plot_w, 0.5):.1f}" '
                       f'height="{h:g}"><title>{escape(_stage_title(turn, s))}</title></rect>')
        if not segments:
            out.append(f'<text class="no-timings" x="{label_w + 4}" y="{y + bar_h - 3}">no timings</text>')
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)


def legend_html() -> str:
    items = "".join(f'<li><span class="swatch stage-{key}"></span>{escape(label)}</li>' for key, label, _, _ in STAGES)
    early = f'<li><span class="swatch early"></span>thin: {escape(EARLY)}</li>'
    return f'<ul class="legend">{items}{early}</ul>'
