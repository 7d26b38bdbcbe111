"""Turn-taking: when the caller speaks.

`converse`: after the greeting, each utterance is spoken once the agent has gone quiet (its reply has played
out) and, with a `ServerState` to ask, once the server says the agent listens again, since a slow clause on a
busy machine can leave a pause inside a reply; with `barge_in_after_ms` the utterances after the first start
that long after the agent's reply began, so they interrupt it.

`play_through`: replay's continuous mode: the whole caller channel once, from the moment the call connects,
whatever the agent does; then the line stays open until the last reply has played out.
"""

from __future__ import annotations

import asyncio
import logging
import time

from voicepipe.caller.line import Line
from voicepipe.caller.report import ClientTurn
from voicepipe.caller.server_api import ServerState
from voicepipe.caller.utterances import Utterance

log = logging.getLogger(__name__)


async def converse(line: Line, utterances: list[Utterance], server: ServerState | None, *, greeting_wait_s: float,
                   reply_timeout_s: float, quiet_s: float, barge_in_after_ms: float | None) -> None:
    await _greeting(line, server, greeting_wait_s, quiet_s)
    for i, utt in enumerate(utterances):
        if line.closed.is_set():
            return
        turn = ClientTurn(i + 1)
        line.result.turns.append(turn)
        line.pacer.speak(utt, turn)
        # Agent audio that arrives from now on belongs to this turn (once the caller has stopped speaking).
        while turn.speech_end is None and not line.closed.is_set():
            await asyncio.sleep(0.01)
        line.current = turn
        deadline = time.monotonic() + reply_timeout_s
        while turn.first_audio is None and time.monotonic() < deadline and not line.closed.is_set():
            await asyncio.sleep(0.01)
        if turn.first_audio is None:
            log.warning("turn %d: no agent audio within %.0f s", turn.index, reply_timeout_s)
            continue
        if barge_in_after_ms is not None and i + 1 < len(utterances):
            await asyncio.sleep(max(0.0, turn.first_audio + barge_in_after_ms / 1000 - time.monotonic()))
            continue
        while not line.agent_quiet(quiet_s) and time.monotonic() < deadline and not line.closed.is_set():
            await asyncio.sleep(0.02)
        if server is not None and i + 1 < len(utterances):
            await server.wait_listening(max(1.0, deadline - time.monotonic()), line.closed)


async def _greeting(line: Line, server: ServerState | None, wait_s: float, quiet_s: float) -> None:
    """Wait for the greeting (if any) to start and play out, or for a quiet spell without one."""
    t0 = time.monotonic()
    deadline = t0 + wait_s
    while time.monotonic() < deadline and not line.closed.is_set():
        started = line.playout.last_audio > 0
        if started and line.agent_quiet(quiet_s):
            break
        if not started and time.monotonic() - t0 > min(wait_s, 3.0) and server is None:
            break
        if not started and server is not None and time.monotonic() - t0 > 1.0 and await server.state() == "listening":
            break  # no greeting
        await asyncio.sleep(0.02)
    if server is not None:
        await server.wait_listening(wait_s, line.closed)


async def play_through(line: Line, channel: Utterance, server: ServerState | None, *, settle_s: float,
                       quiet_s: float, reply_timeout_s: float) -> None:
    """The result has one `ClientTurn` for the whole channel (`audio_start` is when its first sample went out);
    the server's record says where the turns were."""
    whole = ClientTurn(1)
    line.result.turns.append(whole)
    line.pacer.speak(channel, whole)
    while line.pacer.busy and not line.closed.is_set():
        await asyncio.sleep(0.02)
    await asyncio.sleep(settle_s)  # let a trailing end of turn be decided
    deadline = time.monotonic() + reply_timeout_s
    while not line.closed.is_set() and time.monotonic() < deadline:
        listening = server is None or await server.state() in ("listening", "ended", None)
        if listening and line.agent_quiet(quiet_s):
            return
        await asyncio.sleep(0.05)
