"""The entry points: `run_call` (speak utterances, taking turns), `play_call` (replay a whole channel) and
`call_wav` (`voicepipe call`). Each connects as the provider would, runs its turn-taking on the line, hangs
up, and collects what the caller measured with the server's record of the call."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

from voicepipe.caller.echo import SpeakerEcho
from voicepipe.caller.line import Line
from voicepipe.caller.links import endpoint_url, http_url, open_link
from voicepipe.caller.playout import RECORD_RATE
from voicepipe.caller.report import CallResult, merge_events, merge_record
from voicepipe.caller.server_api import ServerState, fetch_call_record
from voicepipe.caller.turns import converse, play_through
from voicepipe.caller.utterances import Utterance, read_wav, split_utterances, with_keys, write_wav
from voicepipe.transports.serializers import CALLER_SERIALIZERS, caller_serializer_class, make_caller_serializer

TRANSPORTS = tuple(CALLER_SERIALIZERS)

TurnTaking = Callable[[Line, ServerState | None], Awaitable[None]]


def line_rate(transport: str) -> int:
    """The rate of the caller's audio on `transport`'s wire, both ways: what a `SpeakerEcho` on that line runs at."""
    return caller_serializer_class(transport).rate


async def run_call(
    url: str,
    transport: str,
    utterances: list[Utterance],
    *,
    params: dict[str, Any] | None = None,
    token: str | None = None,
    call_id: str | None = None,
    greeting_wait_s: float = 20.0,
    reply_timeout_s: float = 60.0,
    quiet_s: float = 0.8,
    barge_in_after_ms: float | None = None,
    record_path: Path | None = None,
    fetch_record: bool = True,
    record_url: str | None = None,
    sync_with_server: bool = True,
    echo: SpeakerEcho | None = None,
) -> CallResult:
    """One call over `transport` at `url` (e.g. ws://127.0.0.1:8000/ws/twilio), speaking `utterances` in turn
    (see caller/turns.py); `record_path` gets the agent's audio as played; `echo`: the caller's microphone picks
    up the agent."""

    async def turns(line: Line, server: ServerState | None) -> None:
        await converse(line, utterances, server, greeting_wait_s=greeting_wait_s, reply_timeout_s=reply_timeout_s,
                       quiet_s=quiet_s, barge_in_after_ms=barge_in_after_ms)

    return await scripted_call(url, transport, turns, params=params, token=token, call_id=call_id,
                       record_path=record_path, fetch_record=fetch_record, record_url=record_url,
                       sync_with_server=sync_with_server, echo=echo)


def run_call_in_process(url: str, transport: str, utterances: list[Utterance], **options: Any) -> CallResult:
    """`run_call` on a loop of its own, for a worker process (see `bench/echo.py`'s `caller_processes`)."""
    return asyncio.run(run_call(url, transport, utterances, **options))


async def play_call(
    url: str,
    transport: str,
    audio: np.ndarray,
    rate: int,
    *,
    params: dict[str, Any] | None = None,
    token: str | None = None,
    call_id: str | None = None,
    record_url: str | None = None,
    settle_s: float = 1.5,
    quiet_s: float = 0.8,
    reply_timeout_s: float = 60.0,
    fetch_record: bool = True,
    keys: list[tuple[float, str]] = (),
    echo: SpeakerEcho | None = None,
) -> CallResult:
    """Continuous mode (replay): play the whole caller channel `audio` once at real-time pace, silences and
    talking over the agent included, pressing `keys` ((seconds into the channel, key)) at their times, then keep
    the line open until the last reply has played out. `echo` (at `line_rate(transport)`): the caller's
    microphone picks up the agent's audio of this call, mixed into the channel as it goes out."""
    channel = with_keys(audio, rate, keys)

    async def turns(line: Line, server: ServerState | None) -> None:
        await play_through(line, channel, server, settle_s=settle_s, quiet_s=quiet_s, reply_timeout_s=reply_timeout_s)

    return await scripted_call(url, transport, turns, params=params, token=token, call_id=call_id,
                       record_url=record_url, fetch_record=fetch_record, sync_with_server=fetch_record, echo=echo)


async def call_wav(url: str, transport: str, wav: Path, **options: Any) -> CallResult:
    """`voicepipe call`: speak the utterances of `wav` (separated by silence) over `transport`."""
    audio, rate = read_wav(wav)
    utterances = split_utterances(audio, rate)
    if not utterances:
        raise ValueError(f"{wav}: no speech found")
    return await run_call(endpoint_url(url, transport), transport, utterances, **options)


async def scripted_call(url: str, transport: str, turns: TurnTaking, *, params: dict[str, Any] | None = None,
                        token: str | None = None, call_id: str | None = None, record_path: Path | None = None,
                        fetch_record: bool = True, record_url: str | None = None,
                        sync_with_server: bool = True, echo: SpeakerEcho | None = None) -> CallResult:
    """Connect as the provider would, run `turns(line, server_state)`, hang up (unless `turns` closed the line
    itself: then no stop message is sent), collect the results. `run_call` and `play_call` are two scripts; the
    soak bench has more (bad frames, abrupt hang-ups)."""
    wire = make_caller_serializer(transport, call_id, params, token)
    result = CallResult(transport, wire.call_id, started=time.monotonic())
    api = http_url(wire, url, record_url)
    async with open_link(wire, url) as link:
        line = Line(link, wire, result, echo)
        await line.send(wire.start())
        tasks = [asyncio.create_task(line.receiver()), asyncio.create_task(line.sender())]
        server = ServerState(api, wire.call_id, token) if sync_with_server and api else None
        try:
            await turns(line, server)
            if not line.closed.is_set():
                await line.send(wire.stop())
        finally:
            if server is not None:
                await server.close()
            line.closed.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        result.agent_audio = line.playout.recording()
    result.setup_ms = getattr(link, "setup_ms", None)
    if result.close_code is None:
        result.close_code = link.close_code
        result.close_reason = link.close_reason
    if record_path is not None:
        write_wav(record_path, result.agent_audio, RECORD_RATE)
    if fetch_record and api:
        result.record = await fetch_call_record(api, wire.call_id, token)
        merge_record(result)
    merge_events(result)
    return result
