"""A case's expectations checked against what a replayed call did: one `Check` per expectation."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from voicepipe.replay.case import CallCase, ReplyChecks, TurnExpectation
from voicepipe.replay.observed import ObservedCall, ObservedTurn
from voicepipe.stt.wer import wer


@dataclass
class Check:
    name: str
    expected: str
    actual: str
    passed: bool
    turn: int | None = None  # None: the whole call

    def as_dict(self) -> dict:
        return asdict(self)


def _short(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


def check_call(case: CallCase, call: ObservedCall) -> list[Check]:
    if call.error:
        return [Check("call", "a completed call with the server's record", call.error, False)]
    out = [Check("turns", str(case.turns), str(len(call.turns)), len(call.turns) == case.turns)]
    for key, budget in (("voice_to_voice", case.voice_to_voice_p95_ms), ("response", case.response_p95_ms)):
        if budget is None:
            continue
        p95 = call.p95(key)
        out.append(Check(f"{key}_p95_ms", f"<= {budget:g}", "no turns measured" if p95 is None else f"{p95:g}",
                         p95 is None or p95 <= budget))
    for i, expected in enumerate(case.expected_turns):
        if i >= len(call.turns):
            out.append(Check("turn", f"caller says {_short(expected.transcript)}", "no such turn", False, i + 1))
            continue
        out += check_turn(expected, case.reply, call.turns[i])
    for turn in call.turns[max(case.turns, len(case.expected_turns)):]:
        out.append(Check("extra_turn", "no such turn", f"caller {_short(turn.user_text)}, agent "
                         f"{_short(turn.agent_text)}", False, turn.turn))
    return out


def check_turn(expected: TurnExpectation, every_turn: ReplyChecks, turn: ObservedTurn) -> list[Check]:
    n = turn.turn
    heard = wer(expected.transcript, turn.user_text)
    out = [Check("transcript", f"{_short(expected.transcript)} (WER <= {expected.max_wer:g})",
                 f"{_short(turn.user_text)} (WER {heard:.2f})", heard <= expected.max_wer, n)]
    if expected.golden is not None and not turn.interrupted:
        drift = wer(expected.golden, turn.agent_text)
        out.append(Check("golden", f"{_short(expected.golden)} (WER <= {expected.golden_max_wer:g})",
                         f"{_short(turn.agent_text)} (WER {drift:.2f})", drift <= expected.golden_max_wer, n))
    for checks in (every_turn, expected.reply):
        out += check_reply(checks, turn)
    if expected.barge_in is False:
        out.append(Check("barge_in", "the reply plays to its end", "interrupted" if turn.interrupted
                         else "played", not turn.interrupted, n))
    elif expected.barge_in:
        out.append(Check("barge_in", "the caller cuts the reply", "interrupted" if turn.interrupted
                         else "not interrupted", turn.interrupted, n))
        if expected.barge_in_stop_ms is not None and turn.interrupted:
            stop = turn.stop_ms
            out.append(Check("barge_in_stop_ms", f"<= {expected.barge_in_stop_ms:g}",
                             "no clear received" if stop is None else f"{stop:g}",
                             stop is not None and stop <= expected.barge_in_stop_ms, n))
    return out


def check_reply(checks: ReplyChecks, turn: ObservedTurn) -> list[Check]:
    text, n = turn.agent_text, turn.turn
    lower = text.lower()
    out = [Check("contains", repr(s), _short(text), s.lower() in lower, n) for s in checks.contains]
    out += [Check("not_contains", f"not {s!r}", _short(text), s.lower() not in lower, n) for s in checks.not_contains]
    out += [Check("regex", f"/{p}/", _short(text), re.search(p, text) is not None, n) for p in checks.regex]
    if checks.max_chars is not None:
        out.append(Check("max_chars", f"<= {checks.max_chars}", str(len(text)), len(text) <= checks.max_chars, n))
    return out
