"""A call case: a directory with `caller.wav` (the caller's channel) and `case.toml` (the call and its expectations).

```toml
[call]
transport = "twilio"            # required: twilio, telnyx, vonage, plivo, exotel or native
system_prompt = "You are ..."   # optional (the server's default otherwise)
greeting = "Hi!"                # optional ("" for none)
deterministic = true            # optional (true): replies are reproducible (greedy, or --seed); --update-golden
audio = "caller.wav"            # optional: the caller's channel, a WAV in the case directory (any rate; stereo: left)
echo = true                     # optional: the call's `echo` parameter, echo cancelling on or off (the transport's
                                # default `echo.enabled` otherwise)

[echo]                          # optional: the caller is on a speakerphone; the agent's replies of this replay, as
delay_ms = 150                  # received over the wire, come back in the caller's channel this much later (0-2000)
level_db = -10                  # ... and this far below what played (-80 to 0); docs/replay.md, "Echo"

[expect]                        # optional
turns = 3                       # the number of turns (default: the number of [[turn]] tables)
voice_to_voice_p95_ms = 4000    # latency budgets, from the server's per-turn timings
response_p95_ms = 3000
not_contains = ["sorry"]        # reply checks for every turn: contains, not_contains, regex, max_chars

[[turn]]                        # one per expected turn, in order
transcript = "I want to book a table."  # required: what the caller says
max_wer = 0.3                   # word error rate allowed for the server's transcript (0.25)
golden = "Sure, for when?"      # expected agent reply (what --update-golden rewrites)
golden_max_wer = 0.5            # how far the reply may drift from the golden text (0.5)
contains = ["table"]            # case-insensitive substrings the reply must (not) hold
not_contains = ["sorry"]
regex = ["(?i)when|what time"]  # Python regexes the reply must match (re.search)
max_chars = 200
barge_in = true                 # the caller talks over this reply: the agent must stop (false: must not be cut)
barge_in_stop_ms = 1200         # ... within this long of the caller starting to speak (the clear arriving)

[[dtmf]]                        # optional, any number: keys the caller presses, re-sent at their times
at_s = 3.2                      # seconds from the start of the caller's channel
digits = "4217#"                # one or more of 0-9 * # A-D
gap_s = 0.2                     # between the keys of `digits` (0.2)
```
A keypad turn's transcript is what the server makes of its entry, e.g. "[keypad: 4 2 1 7]".
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any

import numpy as np

from voicepipe.errors import VoicepipeError
from voicepipe.replay.audio import AudioFileError, read_caller_channel

CASE_FILE = "case.toml"
REPLAY_TRANSPORTS = ("twilio", "telnyx", "vonage", "plivo", "exotel", "native")


class CaseError(VoicepipeError):
    """A case that cannot be run: one line naming the file and the field."""

    def __init__(self, path: Path, where: str, problem: str) -> None:
        super().__init__(f"{path}: {where}: {problem}")
        self.path, self.where, self.problem = path, where, problem


@dataclass
class ReplyChecks:
    contains: list[str] = field(default_factory=list)
    not_contains: list[str] = field(default_factory=list)
    regex: list[str] = field(default_factory=list)
    max_chars: int | None = None


@dataclass
class TurnExpectation:
    transcript: str
    max_wer: float = 0.25
    golden: str | None = None
    golden_max_wer: float = 0.5
    reply: ReplyChecks = field(default_factory=ReplyChecks)
    barge_in: bool | None = None
    barge_in_stop_ms: float | None = None


@dataclass
class CallerEcho:
    """The echo path of a caller on a speakerphone (`caller.echo.SpeakerEcho`, mixed in by the replay's caller)."""

    delay_ms: float
    level_db: float


@dataclass
class CallCase:
    name: str
    directory: Path
    transport: str
    audio: np.ndarray  # int16, the caller's channel
    rate: int
    system_prompt: str | None = None
    greeting: str | None = None
    deterministic: bool = True
    turns: int = 0
    voice_to_voice_p95_ms: float | None = None
    response_p95_ms: float | None = None
    reply: ReplyChecks = field(default_factory=ReplyChecks)  # for every turn
    expected_turns: list[TurnExpectation] = field(default_factory=list)
    keys: list[tuple[float, str]] = field(default_factory=list)  # (seconds into the channel, key), in time order
    echo_cancelling: bool | None = None  # the call's `echo` parameter (None: the transport's default)
    echo: CallerEcho | None = None  # the caller's microphone picks up the replay's replies

    @property
    def path(self) -> Path:
        return self.directory / CASE_FILE

    @property
    def duration_s(self) -> float:
        return len(self.audio) / self.rate


# field name -> (accepted types, type name for errors)
_STR, _BOOL = ((str,), "a string"), ((bool,), "true or false")
_NUM = ((int, float), "a number")
_INT = ((int,), "an integer")
_STRS = ((list,), "a list of strings")
_CALL_FIELDS = {"transport": _STR, "system_prompt": _STR, "greeting": _STR, "deterministic": _BOOL, "audio": _STR,
                "echo": _BOOL}
_ECHO_FIELDS = {"delay_ms": _NUM, "level_db": _NUM}
MAX_ECHO_DELAY_MS = 2000.0
_REPLY_FIELDS = {"contains": _STRS, "not_contains": _STRS, "regex": _STRS, "max_chars": _INT}
_EXPECT_FIELDS = {"turns": _INT, "voice_to_voice_p95_ms": _NUM, "response_p95_ms": _NUM, **_REPLY_FIELDS}
_TURN_FIELDS = {"transcript": _STR, "max_wer": _NUM, "golden": _STR, "golden_max_wer": _NUM,
                "barge_in": _BOOL, "barge_in_stop_ms": _NUM, **_REPLY_FIELDS}
_DTMF_FIELDS = {"at_s": _NUM, "digits": _STR, "gap_s": _NUM}
DTMF_KEYS = frozenset("0123456789*#ABCD")


class _Table:
    """One TOML table under validation: typed getters that raise `CaseError` naming `prefix.key`."""

    def __init__(self, path: Path, prefix: str, data: Any, fields: dict[str, tuple[tuple[type, ...], str]]) -> None:
        self.path, self.prefix = path, prefix
        if not isinstance(data, dict):
            raise CaseError(path, prefix, "must be a table")
        for key, value in data.items():
            if key not in fields:
                raise CaseError(path, self.name(key), f"unknown field (expected one of: {', '.join(fields)})")
            types, what = fields[key]
            if isinstance(value, bool) and bool not in types or not isinstance(value, types):
                raise CaseError(path, self.name(key), f"must be {what}, got {_toml_type(value)}")
            if (types, what) == _STRS and not all(isinstance(v, str) and v for v in value):
                raise CaseError(path, self.name(key), "must be a list of non-empty strings")
        self.data = data

    def name(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def get(self, key: str, default: Any = None, *, required: bool = False) -> Any:
        if key not in self.data:
            if required:
                raise CaseError(self.path, self.name(key), "missing required field")
            return default
        return self.data[key]

    def number(self, key: str, default: float | None, low: float, high: float | None = None) -> float | None:
        value = self.get(key, default)
        if value is not None and math.isnan(value):
            raise CaseError(self.path, self.name(key), "must be a number, got nan")
        if value is not None and (value < low or (high is not None and value > high)):
            bound = f"between {low:g} and {high:g}" if high is not None else f">= {low:g}"
            raise CaseError(self.path, self.name(key), f"must be {bound}, got {value}")
        return value

    def reply_checks(self) -> ReplyChecks:
        for i, pattern in enumerate(self.get("regex", [])):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise CaseError(self.path, f"{self.name('regex')}[{i}]", f"not a valid regex ({exc})") from None
        max_chars = self.number("max_chars", None, 1)
        return ReplyChecks(list(self.get("contains", [])), list(self.get("not_contains", [])),
                           list(self.get("regex", [])), None if max_chars is None else int(max_chars))


def _toml_type(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "an array",
             dict: "a table"}
    return names.get(type(value), type(value).__name__)


def load_case(directory: Path) -> CallCase:
    """Read and check a case directory; every problem is a `CaseError` naming the file and the field."""
    directory = Path(directory)
    path = directory / CASE_FILE
    if not path.is_file():
        raise CaseError(path, CASE_FILE, "missing (a case directory holds case.toml and caller.wav)")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise CaseError(path, "syntax", f"not valid TOML ({exc})") from None
    top = _Table(path, "", data, {"call": ((dict,), "a table"), "expect": ((dict,), "a table"),
                                  "turn": ((list,), "an array of tables ([[turn]])"),
                                  "dtmf": ((list,), "an array of tables ([[dtmf]])"),
                                  "echo": ((dict,), "a table")})
    call = _Table(path, "call", top.get("call", required=True), _CALL_FIELDS)
    transport = call.get("transport", required=True)
    if transport not in REPLAY_TRANSPORTS:
        raise CaseError(path, "call.transport", f"{transport!r} is not one of: {', '.join(REPLAY_TRANSPORTS)}")
    audio_name = call.get("audio", "caller.wav")
    if PurePath(audio_name).is_absolute() or ".." in PurePath(audio_name).parts:
        raise CaseError(path, "call.audio", f"{audio_name!r}: name a file inside the case directory")
    try:
        audio, rate = read_caller_channel(directory / audio_name)
    except AudioFileError as exc:
        raise CaseError(path, "call.audio", f"{directory / audio_name}: {exc}") from None
    turns = [_turn(path, i, raw) for i, raw in enumerate(top.get("turn", []))]
    expect = _Table(path, "expect", top.get("expect", {}), _EXPECT_FIELDS)
    n_turns = expect.number("turns", len(turns), 0)
    if n_turns < len(turns):
        raise CaseError(path, "expect.turns", f"{n_turns} is fewer than the {len(turns)} [[turn]] tables")
    return CallCase(
        name=directory.resolve().name, directory=directory, transport=transport, audio=audio, rate=rate,
        system_prompt=call.get("system_prompt"), greeting=call.get("greeting"),
        deterministic=call.get("deterministic", True), turns=int(n_turns),
        voice_to_voice_p95_ms=expect.number("voice_to_voice_p95_ms", None, 0),
        response_p95_ms=expect.number("response_p95_ms", None, 0),
        reply=expect.reply_checks(), expected_turns=turns,
        keys=sorted(key for i, raw in enumerate(top.get("dtmf", [])) for key in _keys(path, i, raw)),
        echo_cancelling=call.get("echo"), echo=_echo(path, top.get("echo")))


def _echo(path: Path, raw: Any) -> CallerEcho | None:
    if raw is None:
        return None
    table = _Table(path, "echo", raw, _ECHO_FIELDS)
    for key in _ECHO_FIELDS:
        table.get(key, required=True)
    return CallerEcho(table.number("delay_ms", None, 0, MAX_ECHO_DELAY_MS), table.number("level_db", None, -80, 0))


def _keys(path: Path, index: int, raw: Any) -> list[tuple[float, str]]:
    table = _Table(path, f"dtmf[{index}]", raw, _DTMF_FIELDS)
    at, gap = table.number("at_s", None, 0), table.number("gap_s", 0.2, 0, 10)
    digits = table.get("digits", required=True)
    if at is None:
        raise CaseError(path, table.name("at_s"), "missing required field")
    if not digits or any(d not in DTMF_KEYS for d in digits):
        raise CaseError(path, table.name("digits"), f"must be keys 0-9 * # A-D, got {digits!r}"[:120])
    return [(round(at + i * gap, 4), d) for i, d in enumerate(digits)]


def _turn(path: Path, index: int, raw: Any) -> TurnExpectation:
    table = _Table(path, f"turn[{index}]", raw, _TURN_FIELDS)
    barge_in = table.get("barge_in")
    stop_ms = table.number("barge_in_stop_ms", None, 0)
    if stop_ms is not None and barge_in is not True:
        raise CaseError(path, table.name("barge_in_stop_ms"), "needs barge_in = true in the same turn")
    return TurnExpectation(
        transcript=table.get("transcript", required=True), max_wer=table.number("max_wer", 0.25, 0),
        golden=table.get("golden"), golden_max_wer=table.number("golden_max_wer", 0.5, 0),
        reply=table.reply_checks(), barge_in=barge_in, barge_in_stop_ms=stop_ms)


def find_cases(paths: list[Path]) -> list[Path]:
    """Case directories from the command line: each path is a case, or a directory of cases (searched
    recursively for case.toml). A path that is neither is an error."""
    found: list[Path] = []
    for path in paths:
        if (path / CASE_FILE).is_file():
            found.append(path)
        elif path.is_dir():
            cases = sorted(p.parent for p in path.rglob(CASE_FILE))
            if not cases:
                raise CaseError(path, CASE_FILE, "no case.toml in this directory or below it")
            found.extend(cases)
        else:
            raise CaseError(path, "path", "does not exist" if not path.exists() else "is not a case directory")
    return found
