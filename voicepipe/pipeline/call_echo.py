"""A call's echo handling: whether it cancels the agent's echo in the caller's audio (its transport's default,
`echo.enabled`, or the call's `echo` parameter, true or false, where `calls.allow_overrides`), and `CallEcho`, its
canceller and level gate (`echo/path.py`) and its text gate (`echo/words.py`) with what they gated."""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

from voicepipe.config import Settings
from voicepipe.echo.canceller import EchoUnavailable, load_speexdsp
from voicepipe.echo.path import EchoPath
from voicepipe.echo.words import AgentWords, is_echo, without_echo
from voicepipe.observability.records import ECHO_METADATA
from voicepipe.turns.backchannel import INTERRUPTIONS, is_backchannel, normalise

log = logging.getLogger(__name__)

GATED_KEPT = 100
DELAY_NOTED_MS = 5.0  # the echo delay estimate goes into the call's timeline when found, and when it moves this far
# An RTP link's far end plays the agent's audio through a jitter buffer and a decoder the server does not see, so
# later than the server's track sends it (what the marks report): a browser's buffer holds 40-200 ms, and over
# `bench echo`'s simulated browser (aiortc's receiver and a 40 ms playout target) echo paths of 20 and 150 ms read
# 208 and 350 ms, and one of 400 ms lay beyond the 500 ms searched and was never found. Over these links the delays
# searched (`echo.max_delay_ms`) go this much further.
FAR_END_BUFFER_MS = {"webrtc": 300, "sip": 300}

_SAID = {True: True, False: False, "true": True, "false": False, "on": True, "off": False, "1": True, "0": False}


def wants_echo_cancelling(settings: Settings, transport: str, params: dict[str, Any]) -> bool:
    said = _said(params.get("echo")) if settings.calls.allow_overrides else None
    return settings.echo.enabled_for(transport) if said is None else said


def _said(value: Any) -> bool | None:
    """A call's `echo` parameter: a bool, or its text (providers pass custom parameters as strings)."""
    if isinstance(value, str):
        value = value.strip().lower()
    return _SAID.get(value) if isinstance(value, str | bool) else None


class CallEcho:
    """One call's echo: the caller's audio cleaned (`process`), and the caller's words judged (`judge`) against the
    agent's words as they went out (`agent_said`)."""

    def __init__(self, path: EchoPath, max_delay_ms: float) -> None:
        self.path = path
        self.words = AgentWords()
        self.max_delay_s = max_delay_ms / 1000
        self.gated_segments = 0  # caller speech whose words were the agent's alone
        self.gated_words = 0  # the agent's words taken out of the caller's
        # each time it did, {t, turn, text, kept} (`judge`): the latest GATED_KEPT, so a long call's record stays small
        self.gated_speech: deque[dict[str, Any]] = deque(maxlen=GATED_KEPT)
        self.cpu_s = 0.0  # this thread's CPU in `process` (bench echo's echo_cpu_ms_per_s), and the audio it took
        self.audio_s = 0.0
        self._delay_noted: float | None = None  # ms, the last `delay_moved` said
        self._openings_noted = 0  # the level gate's openings `gate_opened` has said

    def process(self, samples):
        started = time.thread_time()
        out = self.path.process(samples)
        self.cpu_s += time.thread_time() - started
        self.audio_s += len(samples) / self.path.rate
        return out

    def delay_moved(self) -> float | None:
        """The echo delay estimate (ms) when it was just found or has moved `DELAY_NOTED_MS` since it last said so;
        None otherwise (the session notes it in the call's timeline)."""
        delay = self.path.delay.delay_ms
        if delay is None or (self._delay_noted is not None and abs(delay - self._delay_noted) < DELAY_NOTED_MS):
            return None
        self._delay_noted = delay
        return round(delay, 1)

    def gate_opened(self) -> bool:
        """Whether the level gate opened for the caller's audio since the last ask (the session notes it in the
        call's timeline): for a caller talking over the agent, or for echo it let through whole (`bench echo` counts
        those, `echo_gate_leaks`)."""
        opened = self.path.gate.openings > self._openings_noted
        self._openings_noted = self.path.gate.openings
        return opened

    def agent_said(self, at: float, text: str, duration_s: float) -> None:
        self.words.sent(at, text, duration_s)

    def _around(self, start: float, end: float) -> list[str]:
        """The agent's words whose echo can be in caller speech from `start` to `end`: as late as the delay
        estimate's longest recent reading, or the longest delay searched before there is one."""
        span = self.path.delay.span
        delay_s = self.max_delay_s if span is None else span[1] / self.path.rate
        return self.words.around(start, end, delay_s)

    def echo_likely(self, text: str, start: float, end: float) -> bool:
        """Half or more of the caller's words so far (a partial, which the STT may still change) are the agent's,
        or they are a lone word over it (`_lone_word`); counts nothing."""
        agent = self._around(start, end)
        return is_echo(text, agent, share=0.5) or _lone_word(text, agent)

    def judge(self, text: str, start: float, end: float, turn: int, over_agent: bool = False) -> str:
        """The caller's words `text`, heard from `start` to `end` (call seconds) in or over `turn`, less the agent's
        own: "" when they were all echo. Speech `over_agent` (its reply still going) that comes to a lone word
        (`_lone_word`) is echo too: the leak the level gate lets through most is residual echo the STT hears as one
        word ("Fred", "like": CI's speakerphone replay), which then cut the reply. A caller who means to stop the
        agent says more, or a word that always takes the turn ("wait", "stop", "what")."""
        agent = self._around(start, end)
        kept = "" if is_echo(text, agent) else without_echo(text, agent)
        if over_agent and _lone_word(kept, agent):
            kept = ""
        if kept != text:
            self.gated_segments += not kept
            self.gated_words += len(text.split()) - len(kept.split())
            self.gated_speech.append({"t": round(start, 2), "turn": turn, "text": text, "kept": kept})
        return kept

    def figures(self) -> dict[str, Any]:
        delay = self.path.delay.delay_ms
        return {"delay_ms": None if delay is None else round(delay, 1), "erle_db": self.path.erle_db,
                "erl_db": self.path.gate.erl_db, "clock_skew_ppm": round(self.path.skew.skew * 1e6, 1),
                "gated_audio_s": round(self.path.gate.gated_samples / self.path.rate, 2),
                "gate_openings": self.path.gate.openings,
                "gated_segments": self.gated_segments, "gated_words": self.gated_words,
                "gated_speech": list(self.gated_speech),
                "cpu_ms": round(1000 * self.cpu_s, 1), "audio_s": round(self.audio_s, 2)}


def _lone_word(text: str, agent: list[str]) -> bool:
    """One word, neither a backchannel nor one that always takes the turn, while the agent's words (`agent`) may
    still be echoing."""
    words = normalise(text).split()
    return len(words) == 1 and words[0] not in INTERRUPTIONS and not is_backchannel(text) and bool(agent)


def open_call_echo(settings: Settings, transport: str, params: dict[str, Any], output: Any, rate: int,
                   call_id: str) -> CallEcho | None:
    """The call's echo handling at `rate` (the caller's audio as the VAD takes it), over the reference `output`
    keeps of what it played; None when the call does not cancel echo or its transport keeps no reference."""
    if not wants_echo_cancelling(settings, transport, params):
        return None
    keep = getattr(output, "far_end_reference", None)
    if keep is None:
        return None
    try:
        load_speexdsp()
    except EchoUnavailable as exc:  # the call goes on as it would without echo cancelling
        log.error("call %s: no echo cancelling: %s", call_id, exc)
        return None
    cfg = settings.echo
    max_delay_ms = cfg.max_delay_ms + FAR_END_BUFFER_MS.get(transport, 0)
    return CallEcho(EchoPath(keep(rate), cfg.filter_ms, cfg.min_delay_ms, max_delay_ms), max_delay_ms)


def keep_echo_figures(metadata: dict[str, Any], echo: CallEcho | None) -> None:
    """The call record keeps its echo figures under `ECHO_METADATA` (and never a caller's value there). Replaced in
    one step: the metrics read a live call's figures from another thread (`Metrics.echo_gated`)."""
    if echo is None:
        metadata.pop(ECHO_METADATA, None)
    else:
        metadata[ECHO_METADATA] = echo.figures()
