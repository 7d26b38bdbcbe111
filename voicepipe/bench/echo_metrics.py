"""`bench echo`'s figures, from what each end of a call knows.

The caller simulator knows when it spoke (each utterance's voiced span as it went out) and when the agent's audio
played at its end; the server's call events say when it held the agent's audio (`hold` .. `unhold`) and cut it
(`clear`: a barge-in), and its record holds the turns it took (VAD span and words). Every time here is on the
caller's clock (`time.monotonic()`: the bench's server runs in the same process, and its event times are moved
onto that clock).

- A *stop*: the agent's audio held (a `hold` until its `unhold`) or cut (a `clear`; not a reopened turn's, which
  cut nothing that had played). A clear during a hold makes that hold a cut.
- The caller *spoke at* t when t falls in one of its utterances' voiced spans, or up to `REACTION_S` after one
  ends (the wire, and a VAD that reads the audio late on a busy loop). Not the echo delay as well: a hold starts
  at a VAD speech start, which the caller's voice cannot give once it has ended, and the echo of a reply's first
  words (which starts within a second of the caller's end) is what this benchmark counts.
- `self_interruptions`: stops that started while the caller did not speak; `echo_hold_ms`: how long those held.
- `echo_turns`: the server's turns whose VAD span touches no caller speech.
- `echo_gate_leaks`: the level gate's openings (`echo_gate_open`) while the agent's audio played and the caller did
  not speak: echo it let through whole for its hangover (or the line's noise against the agent's quiet sounds: the
  clean calls' count is that floor). A self-interruption is such a leak that the VAD then took for speech; the
  VAD's state over the gate's silence makes it slow to, so the leaks count what the gate lets through where the
  self-interruptions count only what came of it (docs/echo.md, "The gate's leaks").
- Barge-in recall: of the scripted barge-ins that began while the agent spoke (its audio playing at the caller,
  or held mid-reply), the share that the agent stopped for within `STOP_WITHIN_S` of their first voiced sample with
  a stop that ended in a cut (the server took it as a barge-in, not a backchannel). One that began while echo held
  the agent is stopped when that hold ended in a cut: a hold released without one lets the reply go on, and the
  caller's words were taken for a backchannel or a noise.
- The agent's audio "plays" from its first chunk at the caller until a clear or a gap of `GAP_S` (a WebRTC track's
  silent frames are not audio, and a busy link delivers a reply in bursts).
- WER: the caller's words as the server's turns hold them against the script: a call's whole script against all
  its turns' words, and each double-talk utterance against the turns that overlap it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from voicepipe.caller import CallResult
from voicepipe.stt.wer import corpus_wer

REACTION_S = 0.3
STOP_WITHIN_S = 0.5
GAP_S = 0.3
REOPEN_S = 0.05  # a clear this close before a `turn_reopened` is the reopen's own (noted in the same step)


@dataclass(frozen=True)
class Said:
    """One utterance as the caller simulator sent it."""

    text: str
    start: float  # its first voiced sample sent
    end: float  # the end of its last voiced sample
    barge_in: bool  # scripted to talk over the agent


@dataclass(frozen=True)
class Stop:
    start: float
    end: float  # `start` for a cut that no hold preceded
    cut: bool


@dataclass
class CallFacts:
    """One finished call, as the figures need it."""

    call_id: str
    level_db: float | None  # None: a clean call (no echo)
    said: list[Said]
    events: list[dict[str, Any]]  # the server's {"type", "at"}, in the order it noted them
    turns: list[tuple[tuple[float, float] | None, str]]  # the server's turns: (VAD span, the caller's words)
    playing: list[tuple[float, float]]  # when the agent's audio played at the caller
    voice_to_voice_ms: list[float]
    echo_figures: dict[str, Any] | None  # the record's `echo_canceller` metadata
    started: float  # when the caller dialled
    ended: float  # when the caller hung up


def call_facts(result: CallResult, texts: list[str], level_db: float | None, started: float | None,
               events: list[dict[str, Any]]) -> CallFacts:
    """`result` of a call whose caller said `texts` (the first to the greeting's listener, the rest as barge-ins);
    `started` is the server's call start on the caller's clock, `events` its events there (see `CallEvents`)."""
    said = [Said(text, turn.speech_start, turn.speech_end, i > 0) for i, (text, turn)
            in enumerate(zip(texts, result.turns, strict=False)) if turn.speech_start and turn.speech_end]
    record = result.record or {}
    turns = []
    for turn in record.get("turns", []):
        line = turn.get("timeline") or {}
        span = None
        if started is not None and "speech_start" in line:
            span = (started + line["speech_start"], started + line.get("speech_end", line["speech_start"]))
        turns.append((span, turn.get("user_text") or ""))
    v2v = [t.voice_to_voice_ms for t in result.turns if t.voice_to_voice_ms is not None]
    ended = max([result.started, *(at for at, _ in result.audio_chunks), *(e["at"] for e in events)])
    return CallFacts(result.call_id, level_db, said, events, turns,
                     playing_spans(result.audio_chunks, result.clears), v2v,
                     (record.get("metadata") or {}).get("echo_canceller"), result.started, ended)


def playing_spans(chunks: list[tuple[float, float]], clears: list[float]) -> list[tuple[float, float]]:
    """When the agent's audio played at the caller: each chunk (received at, seconds) after the one before, as the
    caller's playout plays it, a clear stops what plays, and spans less than `GAP_S` apart are one."""
    spans: list[list[float]] = []
    timeline = sorted([(at, seconds) for at, seconds in chunks] + [(at, None) for at in clears],
                      key=lambda item: item[0])
    for at, seconds in timeline:
        if seconds is None:
            if spans and spans[-1][1] > at:
                spans[-1][1] = max(spans[-1][0], at)
        elif spans and spans[-1][1] + GAP_S >= at:
            spans[-1][1] = max(spans[-1][1], at) + seconds
        else:
            spans.append([at, at + seconds])
    return [(a, b) for a, b in spans if b > a]


def stops(events: list[dict[str, Any]], until: float) -> list[Stop]:
    """The agent's audio held or cut, from the server's events (a hold still on at `until` ends there)."""
    reopens = [e["at"] for e in events if e["type"] == "turn_reopened"]
    out, held, cut = [], None, False
    for event in sorted(events, key=lambda e: e["at"]):
        kind, at = event["type"], event["at"]
        if kind == "hold" and held is None:
            held, cut = at, False
        elif kind == "clear" and not any(0 <= r - at <= REOPEN_S for r in reopens):
            if held is None:
                out.append(Stop(at, at, True))
            cut = True
        elif kind == "unhold" and held is not None:
            out.append(Stop(held, at, cut))
            held = None
    if held is not None:
        out.append(Stop(held, max(held, until), cut))
    return out


def caller_spoke(said: list[Said], t: float) -> bool:
    return any(s.start <= t <= s.end + REACTION_S for s in said)


def gate_leaks(call: CallFacts) -> list[float]:
    """When the level gate opened while the agent's audio played and the caller did not speak (see the module's
    doc). Openings in the quiet before or after the agent's audio pass the line alone."""
    return [e["at"] for e in call.events if e["type"] == "echo_gate_open" and not caller_spoke(call.said, e["at"])
            and any(a <= e["at"] <= b for a, b in call.playing)]


def touches(span: tuple[float, float] | None, said: Said) -> bool:
    """Whether a turn's VAD `span` holds some of `said`."""
    return span is not None and span[0] <= said.end + REACTION_S and span[1] >= said.start


@dataclass
class CallFigures:
    self_interruptions: int
    echo_hold_s: float
    echo_turns: int
    agent_speaking_s: float
    gate_leaks: int = 0
    barge_ins: list[tuple[bool, bool]] = field(default_factory=list)  # (over the agent, stopped in time)
    double_talk: list[tuple[str, str]] = field(default_factory=list)  # (script, the words heard over that span)
    words: tuple[str, str] = ("", "")  # the whole script, and every turn's words


def call_figures(call: CallFacts) -> CallFigures:
    stopped = stops(call.events, call.ended)
    own = [s for s in stopped if not caller_spoke(call.said, s.start)]
    echo_turns = sum(1 for span, _ in call.turns if span is not None and not any(touches(span, s) for s in call.said))
    figures = CallFigures(len(own), sum(s.end - s.start for s in own), echo_turns,
                          sum(b - a for a, b in call.playing), len(gate_leaks(call)),
                          words=(" ".join(s.text for s in call.said), " ".join(text for _, text in call.turns)))
    for s in (s for s in call.said if s.barge_in):
        over, stopped_in_time = barge_in_outcome(s, stopped, call.playing)
        figures.barge_ins.append((over, stopped_in_time))
        if over:
            figures.double_talk.append((s.text, " ".join(text for span, text in call.turns if touches(span, s))))
    return figures


def barge_in_outcome(said: Said, stopped: list[Stop], playing: list[tuple[float, float]]) -> tuple[bool, bool]:
    """(whether `said` talked over the agent, whether the agent stopped for it in time): see the module's doc."""
    hold = next((p for p in stopped if p.start <= said.start < p.end), None)
    if hold is not None:
        return True, hold.cut
    if not any(a <= said.start < b for a, b in playing):
        return False, False
    first = min((p for p in stopped if p.start >= said.start), key=lambda p: p.start, default=None)
    return True, first is not None and first.start - said.start <= STOP_WITHIN_S and first.cut


def call_timeline(call: CallFacts) -> dict[str, Any]:
    """What happened when in one call, in seconds from the caller's dialling: what it said, when the agent's audio
    played at its end, the stops (start, end, cut, whether the caller was silent: a self-interruption), the level
    gate's leaks (`gate_leaks`) and the words of each of the server's turns."""
    def since(t: float) -> float:
        return round(t - call.started, 2)

    return {"said": [[since(s.start), since(s.end)] for s in call.said],
            "played": [[since(a), since(b)] for a, b in call.playing],
            "stops": [[since(s.start), since(s.end), s.cut, not caller_spoke(call.said, s.start)]
                      for s in stops(call.events, call.ended)],
            "gate_leaks": [since(at) for at in gate_leaks(call)],
            "heard": [text for _, text in call.turns]}


def ratio(over: float | None, under: float | None, what: str) -> tuple[float | None, str | None]:
    """`over / under`, or None and why not."""
    if over is None or under is None:
        return None, f"no {what} measured in the {'echo' if over is None else 'clean'} calls"
    if under == 0:
        return (1.0, None) if over == 0 else (None, f"the clean calls' {what} is 0 (echo calls: {over:.3f})")
    return round(over / under, 3), None


def p50(values: list[float]) -> float | None:
    return round(float(np.percentile(values, 50)), 1) if values else None


def group_figures(calls: list[CallFacts]) -> dict[str, Any]:
    """The figures of a group of calls (a grid cell, an echo level, all echo calls, the clean ones)."""
    per_call = [call_figures(c) for c in calls]
    barge_ins = [b for f in per_call for b in f.barge_ins]
    over = [stopped for over_agent, stopped in barge_ins if over_agent]
    cpu = [c.echo_figures for c in calls if c.echo_figures and "cpu_ms" in c.echo_figures]
    audio_s = sum(f["audio_s"] for f in cpu)
    delays = [c.echo_figures.get("delay_ms") for c in calls if c.echo_figures]
    return {
        "calls": len(calls),
        "self_interruptions": sum(f.self_interruptions for f in per_call),
        "echo_turns": sum(f.echo_turns for f in per_call),
        "echo_gate_leaks": sum(f.gate_leaks for f in per_call),
        "echo_hold_ms": round(1000 * sum(f.echo_hold_s for f in per_call), 1),
        "agent_speaking_ms": round(1000 * sum(f.agent_speaking_s for f in per_call), 1),
        "barge_ins": len(barge_ins), "barge_ins_over_agent": len(over), "barge_ins_stopped": sum(over),
        "barge_in_recall": round(sum(over) / len(over), 3) if over else None,
        "voice_to_voice_p50_ms": p50([v for c in calls for v in c.voice_to_voice_ms]),
        "wer": round(corpus_wer(f.words for f in per_call), 4) if calls else None,
        "wer_double_talk": round(corpus_wer(p for f in per_call for p in f.double_talk), 4) if over else None,
        "echo_cpu_ms_per_s": round(sum(f["cpu_ms"] for f in cpu) / audio_s, 2) if audio_s else None,
        "echo_delay_found_ms": [d for d in delays if d is not None],
    }


def headline(calls: list[CallFacts], levels: list[float]) -> dict[str, Any]:
    """The flat keys over the grid (echo calls), their ratios against the clean calls, and `null_reasons` for the
    keys that could not be computed."""
    echo = group_figures([c for c in calls if c.level_db is not None])
    clean = group_figures([c for c in calls if c.level_db is None])
    by_level = {level: group_figures([c for c in calls if c.level_db == level]) for level in levels}
    reasons: dict[str, str] = {}
    recalls = {level: g["barge_in_recall"] for level, g in by_level.items()}
    out: dict[str, Any] = {key: echo[key] for key in ("self_interruptions", "echo_turns", "echo_gate_leaks",
                                                      "echo_hold_ms", "agent_speaking_ms")}
    out["echo_hold_share"] = round(echo["echo_hold_ms"] / echo["agent_speaking_ms"], 4) \
        if echo["agent_speaking_ms"] else None
    known = [r for r in recalls.values() if r is not None]
    out["barge_in_recall_min"] = min(known) if known and len(known) == len(recalls) else None
    if out["barge_in_recall_min"] is None:
        reasons["barge_in_recall_min"] = "no barge-in over the agent's audio at echo levels " + \
            ", ".join(f"{level:g} dB" for level, r in recalls.items() if r is None)
    for key, figure, what in (("v2v_p50_echo_over_clean", "voice_to_voice_p50_ms", "voice-to-voice"),
                              ("wer_echo_over_clean", "wer", "WER"),
                              ("wer_double_talk_echo_over_clean", "wer_double_talk", "double-talk WER")):
        out[key], reason = ratio(echo[figure], clean[figure], what)
        if reason:
            reasons[key] = reason
    out["echo_cpu_ms_per_s"] = echo["echo_cpu_ms_per_s"]
    if out["echo_cpu_ms_per_s"] is None:
        reasons["echo_cpu_ms_per_s"] = "no call record's echo_canceller figures hold cpu_ms and audio_s " \
                                       "(echo cancelling off, or a server that does not count them)"
    return {**out, "null_reasons": reasons, "echo": echo, "clean": clean,
            "by_level": {f"{level:g}": g for level, g in by_level.items()}}
