"""`voicepipe replay --repeat N`: each case replayed N times, and whether its turns came out the same every time.

Every later run is compared with the first: the number of turns, and turn by turn the caller's transcript, the
barge-in flag, the number of reopened end-of-turn decisions, and the agent's text where neither run's reply was
interrupted (an interrupted reply's text depends on when the caller cut it). Each difference is a failed check
naming the run, the turn, the field and both values. Voice-to-voice is wall-clock, so it is not compared; its
spread over the runs is reported (min / median / max, over every turn and turn by turn).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

from voicepipe.replay.checks import Check
from voicepipe.replay.observed import ObservedCall, ObservedTurn
from voicepipe.replay.results import CaseResult


@dataclass(frozen=True)
class Difference:
    run: int  # the run (from 1) that differed from run 1
    turn: int | None  # None: the call
    field: str
    first: str  # run 1's value
    other: str  # this run's

    def check(self) -> Check:
        return Check(f"same_{self.field}", f"run 1: {self.first}", f"run {self.run}: {self.other}", False, self.turn)


def _text(text: str) -> str:
    return repr(" ".join(text.split()))


def turn_differences(a: ObservedTurn, b: ObservedTurn) -> Iterator[tuple[str, str, str]]:
    """(field, a's value, b's value) for each compared field where the two turns differ."""
    fields = [("user_text", _text(a.user_text), _text(b.user_text)),
              ("barge_in", str(a.interrupted), str(b.interrupted)),
              ("reopened", str(a.reopened), str(b.reopened))]
    if not a.interrupted and not b.interrupted:
        fields.append(("agent_text", _text(a.agent_text), _text(b.agent_text)))
    return ((name, x, y) for name, x, y in fields if x != y)


def differences(calls: list[ObservedCall]) -> list[Difference]:
    """What differed between the first call and each later one of the same case."""
    first, out = calls[0], []
    for run, call in enumerate(calls[1:], start=2):
        if first.error or call.error:  # no turns to compare: one made the call and the other did not, or neither
            if first.error != call.error:
                out.append(Difference(run, None, "error", str(first.error), str(call.error)))
            continue
        if len(call.turns) != len(first.turns):
            out.append(Difference(run, None, "turns", str(len(first.turns)), str(len(call.turns))))
        for a, b in zip(first.turns, call.turns, strict=False):
            out += [Difference(run, a.turn, name, x, y) for name, x, y in turn_differences(a, b)]
    return out


def spread(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"min": None, "median": None, "max": None, "n": 0}
    return {"min": round(min(values), 1), "median": round(statistics.median(values), 1),
            "max": round(max(values), 1), "n": len(values)}


def voice_to_voice(calls: list[ObservedCall]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The spread of voice-to-voice (ms) over every turn of every run, and turn by turn over the runs."""
    by_turn: dict[int, list[float]] = {}
    for call in calls:
        for turn in call.turns:
            value = turn.timings_ms.get("voice_to_voice")
            if isinstance(value, (int, float)):
                by_turn.setdefault(turn.turn, []).append(float(value))
    every = [v for values in by_turn.values() for v in values]
    return spread(every), [{"turn": n, **spread(values)} for n, values in sorted(by_turn.items())]


def repeated_result(results: list[CaseResult]) -> CaseResult:
    """One case's runs as one result: the first run's call and checks, each later run's failed checks (named with
    their run), then a failed check per difference, or one passing check when every run was the same."""
    first, runs = results[0], len(results)
    found = differences([r.call for r in results])
    checks = list(first.checks)
    for run, result in enumerate(results[1:], start=2):
        checks += [replace(c, name=f"run {run}: {c.name}") for c in result.checks if not c.passed]
    same = f"the same turns, transcripts, barge-ins, reopens and replies in {runs} runs"
    checks += [d.check() for d in found] or [Check("same_in_every_run", same, same, True)]
    every, by_turn = voice_to_voice([r.call for r in results])
    repeat = {"runs": runs, "same": not found, "differences": [asdict(d) for d in found],
              "runs_passed": sum(r.passed for r in results), "voice_to_voice_ms": every,
              "voice_to_voice_ms_by_turn": by_turn, "each_run": [r.as_dict() for r in results]}
    call = replace(first.call, send_lag_ms=[lag for r in results for lag in r.call.send_lag_ms])  # the run's lag
    return replace(first, call=call, checks=checks, repeat=repeat)
