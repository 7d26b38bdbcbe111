"""`--update-golden`: rewrite the expected agent text (`golden`) of deterministic cases from a run, print the diff.

The edit is made on the file's lines, so the author's comments and layout stay: in the n-th `[[turn]]` table a
`golden = "..."` line is replaced (or added after the header). Interrupted turns keep their golden text (a cut
reply depends on timing), as do turns the run did not reach.
"""

from __future__ import annotations

import difflib
import re
import tomllib

from voicepipe.replay.case import CallCase, CaseError
from voicepipe.replay.init_case import toml_value
from voicepipe.replay.observed import ObservedCall

_HEADER = re.compile(r"^\s*\[")
_TURN_HEADER = re.compile(r"^\s*\[\[\s*turn\s*\]\]\s*(#.*)?$")
_GOLDEN = re.compile(r"^(\s*)golden\s*=")


def updated_goldens(case: CallCase, call: ObservedCall) -> dict[int, str]:
    """Turn index (0-based) -> the new golden text, for the turns whose reply changed."""
    if not case.deterministic or call.error:
        return {}
    out = {}
    for i, (expected, turn) in enumerate(zip(case.expected_turns, call.turns, strict=False)):
        if not turn.interrupted and expected.golden != turn.agent_text:
            out[i] = turn.agent_text
    return out


def rewrite_goldens(text: str, goldens: dict[int, str], path) -> str:
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    turn, in_turn = -1, False
    for line in lines:
        if _HEADER.match(line):
            in_turn = bool(_TURN_HEADER.match(line))
            if in_turn:
                turn += 1
                out.append(line)
                if turn in goldens:  # the new value goes right under the header; an old line is dropped below
                    out.append(f"golden = {toml_value(goldens[turn])}\n")
                continue
        elif in_turn and turn in goldens and _GOLDEN.match(line):
            if '"""' in line or "'''" in line:
                raise CaseError(path, f"turn[{turn}].golden", "a multi-line string cannot be rewritten; use one line")
            continue
        out.append(line)
    return "".join(out)


def update_golden(case: CallCase, call: ObservedCall) -> str:
    """Rewrite case.toml with the run's replies; returns the unified diff ('' when nothing changed)."""
    goldens = updated_goldens(case, call)
    if not goldens:
        return ""
    before = case.path.read_text(encoding="utf-8")
    after = rewrite_goldens(before, goldens, case.path)
    turns = tomllib.loads(after).get("turn", [])
    for i, text in goldens.items():
        if i >= len(turns) or turns[i].get("golden") != text:
            raise CaseError(case.path, f"turn[{i}].golden", "could not be rewritten (write turns as [[turn]] tables)")
    case.path.write_text(after, encoding="utf-8")
    return "".join(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                        str(case.path), str(case.path)))
