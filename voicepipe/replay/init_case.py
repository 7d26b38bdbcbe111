"""`voicepipe replay init`: a recorded call becomes a case, its expectations pre-filled from that run.

Pre-filled: the transport, system prompt and greeting of the call; the keys the caller pressed, at their times;
per turn the caller's transcript (WER 0.25),
the agent's reply as golden text, whether the reply was interrupted (and how fast the agent stopped), a
reply length limit; the turn count; voice-to-voice and response p95 budgets with headroom (x2 or +1 s).
The author then tightens them. Where the caller's channel carries the recorded run's echo (recorded_echo.py), the
case says so in a comment and a warning is logged: a replay cannot cancel that echo (docs/replay.md, "Echo").
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np

from voicepipe.caller import write_wav
from voicepipe.errors import VoicepipeError
from voicepipe.replay.case import CASE_FILE, REPLAY_TRANSPORTS, load_case
from voicepipe.replay.recorded_echo import RecordedEcho, recorded_echo
from voicepipe.replay.recording import Recording, load_recording

log = logging.getLogger(__name__)


def toml_value(value: Any) -> str:
    """A TOML literal for a str, bool, int, float or list of those."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):  # JSON's escapes are TOML basic-string escapes; TOML also wants DEL escaped
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML literal for {type(value).__name__}")


def budget_ms(observed: list[float]) -> int | None:
    """A latency budget with headroom over the recorded p95: x2 or +1000 ms, whichever is more (a replay on the
    same machine varies; the author tightens it)."""
    if not observed:
        return None
    p95 = float(np.percentile(observed, 95))
    return int(math.ceil(round(max(p95 * 2, p95 + 1000), 3) / 100) * 100)


def stop_times_ms(events: list[dict[str, Any]]) -> list[float]:
    """For each clear in the recording: ms since the caller's speech started (the last VAD speech_start)."""
    out, speech_start = [], None
    for event in events:
        if event["type"] == "vad" and event.get("kind") == "speech_start":
            speech_start = event.get("t")
        elif event["type"] == "clear" and isinstance(speech_start, (int, float)) \
                and isinstance(event.get("t"), (int, float)):
            out.append((event["t"] - speech_start) * 1000)
    return out


ECHO_NOTE = """\
# caller.wav carries the recorded run's echo: the agent's audio comes back in it {delay_ms:g} ms after it was sent
# (the time it waited to play, up to calls.max_lead_ms, included), its direct path at {level_db:g} dB. A replay
# plays that echo as recorded, at the moments the recorded replies played; the replay's replies play at others
# and may differ, so its echo canceller cannot take it out and the call may take it for the caller
# (docs/replay.md, "Echo"). To test this call with its echo, record the caller without it and declare the echo
# path, for the replay to echo its own replies:
# [echo]
# delay_ms = ...  # after the agent's audio plays at the caller's end
# level_db = ...  # every path together, against what played"""


def case_toml(rec: Recording, echo: RecordedEcho | None = None) -> str:
    start = rec.call_start
    transport = start.get("transport")
    if transport not in REPLAY_TRANSPORTS:
        raise VoicepipeError(f"{rec.directory}: the call came over {transport!r}; replay drives "
                             f"{', '.join(REPLAY_TRANSPORTS)}.", "set [call] transport in the case by hand.")
    lines = [f"# Made by `voicepipe replay init` from {rec.directory.name}: tighten the expectations.",
             "[call]", f"transport = {toml_value(transport)}"]
    if isinstance(start.get("system_prompt"), str):
        lines.append(f"system_prompt = {toml_value(start['system_prompt'])}")
    lines.append(f"greeting = {toml_value(start.get('greeting') or '')}")
    lines.append("deterministic = true")
    if echo is not None:
        lines += ["", ECHO_NOTE.format(delay_ms=echo.delay_ms, level_db=echo.level_db)]
    timings = [t.get("timings_ms") or {} for t in rec.turns]
    lines += ["", "[expect]", f"turns = {len(rec.turns)}"]
    for key in ("voice_to_voice", "response"):
        budget = budget_ms([t[key] for t in timings if isinstance(t.get(key), (int, float))])
        if budget is not None:
            lines.append(f"{key}_p95_ms = {budget}")
    stops = iter(stop_times_ms(rec.events))
    for turn in rec.turns:
        agent = turn.get("agent_text") or ""
        lines += ["", "[[turn]]", f"transcript = {toml_value(turn.get('user_text') or '')}", "max_wer = 0.25"]
        if turn.get("interrupted"):
            stop = next(stops, None)
            limit = budget_ms([stop]) if stop is not None else 1500
            lines += ["barge_in = true", f"barge_in_stop_ms = {limit}"]
        else:
            lines += [f"golden = {toml_value(agent)}", "golden_max_wer = 0.5", "barge_in = false"]
        lines.append(f"max_chars = {max(100, 2 * len(agent))}")
    for event in rec.events:
        at, digit = event.get("t"), event.get("digit")
        if event["type"] == "dtmf" and isinstance(at, (int, float)) and isinstance(digit, str):
            lines += ["", "[[dtmf]]", f"at_s = {round(float(at), 3)!r}", f"digits = {toml_value(digit)}"]
    return "\n".join(lines) + "\n"


def init_case(recording_dir: Path, out: Path | None = None) -> Path:
    """Write `out`/case.toml and `out`/caller.wav (the caller's channel) from a recording; returns `out`."""
    rec = load_recording(recording_dir)
    out = Path(out) if out is not None else Path("cases") / Path(recording_dir).resolve().name
    if (out / CASE_FILE).exists():
        raise VoicepipeError(f"{out / CASE_FILE}: already exists.", "pass another --out directory or remove it.")
    echo = recorded_echo(rec.caller, rec.agent, rec.rate) if rec.agent is not None else None
    if echo is not None:
        log.warning("%s: the caller's channel carries the recorded run's echo (%g ms after the agent's audio was "
                    "sent, %g dB); a replay cannot cancel it: see the note in case.toml", recording_dir,
                    echo.delay_ms, echo.level_db)
    text = case_toml(rec, echo)
    out.mkdir(parents=True, exist_ok=True)
    write_wav(out / "caller.wav", rec.caller, rec.rate)
    (out / CASE_FILE).write_text(text, encoding="utf-8")
    load_case(out)  # what was written must read back
    return out
