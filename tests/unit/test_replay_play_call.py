"""The call client's continuous mode (what replay plays): the whole caller channel goes out once, in order, at
real-time pace, whatever the agent does; its per-frame send lag is measured. Against a loopback WebSocket server
that speaks the native protocol and notes when each frame arrives. A case's speakerphone echo is mixed in by the
same client, from the agent's audio of that call."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np

from tests.replay_fixtures import write_case
from voicepipe.caller import play_call
from voicepipe.replay.case import load_case
from voicepipe.replay.runner import call_params, caller_echo

RATE = 16000


def test_the_whole_channel_arrives_in_order_at_real_time_pace() -> None:
    from websockets.asyncio.server import serve

    rng = np.random.default_rng(1)
    audio = np.concatenate([np.zeros(RATE // 2, np.int16), rng.integers(-9000, 9000, RATE, dtype=np.int16),
                            np.zeros(RATE // 4, np.int16)])  # 1.75 s: silence, "speech", silence
    arrivals: list[tuple[float, bytes]] = []
    messages: list[dict] = []

    async def handler(ws) -> None:
        async for frame in ws:
            if isinstance(frame, bytes):
                arrivals.append((time.monotonic(), frame))
            else:
                messages.append(json.loads(frame))
                if messages[-1]["type"] == "start":  # the agent talks over the caller: nothing changes
                    await ws.send(np.zeros(3200, np.int16).tobytes())

    async def main():
        async with serve(handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            return await play_call(f"ws://127.0.0.1:{port}/ws", "native", audio, RATE, params={"seed": "5"},
                                   settle_s=0.3, quiet_s=0.2, fetch_record=False)

    result = asyncio.run(main())
    assert messages[0]["type"] == "start" and messages[0]["seed"] == "5" and messages[-1]["type"] == "stop"
    received = np.frombuffer(b"".join(f for _, f in arrivals), dtype="<i2")
    assert len(received) >= len(audio) and np.array_equal(received[: len(audio)], audio)  # then line silence
    assert not received[len(audio):].any()
    # Real-time pace: frame k arrives about k * 20 ms after the first (the bounds on lateness allow for a loaded
    # 2-core CI machine), and the channel takes its own length to send, not less.
    times = np.array([t for t, _ in arrivals])
    drift_ms = (times - times[0] - np.arange(len(times)) * 0.02) * 1000
    assert times[-1] - times[0] >= len(audio) / RATE - 0.1
    assert np.percentile(drift_ms, 95) < 150, drift_ms
    assert len(result.send_lag_ms) >= len(arrivals) - 1 and np.percentile(result.send_lag_ms, 95) < 150
    assert result.turns[0].audio_start is not None and result.greeting_audio_s > 0


def test_keys_are_pressed_at_their_times_in_the_channel() -> None:
    """A case's [[dtmf]] keys go out with the frame they fall in, after the channel's audio if need be."""
    from websockets.asyncio.server import serve

    audio = np.zeros(RATE // 2, np.int16)  # 0.5 s of channel; the last key comes after it
    first_frame: list[float] = []
    keys: list[tuple[float, str]] = []

    async def handler(ws) -> None:
        async for frame in ws:
            if isinstance(frame, bytes):
                first_frame[:] = first_frame or [time.monotonic()]
            elif json.loads(frame)["type"] == "dtmf":
                keys.append((time.monotonic(), json.loads(frame)["digit"]))

    async def main():
        async with serve(handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            await play_call(f"ws://127.0.0.1:{port}/ws", "native", audio, RATE, settle_s=0.1, quiet_s=0.1,
                            fetch_record=False, keys=[(0.8, "#"), (0.2, "4")])

    asyncio.run(main())
    assert [k for _, k in keys] == ["4", "#"]
    offsets = [t - first_frame[0] for t, _ in keys]  # the first frame goes out at 0 s of the channel
    assert 0.15 < offsets[0] < 0.35 and 0.75 < offsets[1] < 0.95, offsets


def test_a_speakerphone_case_mixes_the_echo_of_this_calls_replies_into_its_channel(tmp_path) -> None:
    """A case's [echo]: what the agent sends in this call comes back in the caller's channel as it goes out, the
    case's delay later (counted on the channel's own clock) and at its level; the channel is otherwise unchanged."""
    from websockets.asyncio.server import serve

    case = load_case(write_case(tmp_path / "c", '[call]\ntransport = "native"\necho = true\n'
                                '[echo]\ndelay_ms = 150\nlevel_db = -10\n', np.zeros(RATE, np.int16), RATE))
    agent = (4000 * np.random.default_rng(2).standard_normal(RATE // 2)).astype(np.int16)
    received: list[bytes] = []
    messages: list[dict] = []

    async def handler(ws) -> None:
        async for frame in ws:
            if isinstance(frame, bytes):
                received.append(frame)
            else:
                messages.append(json.loads(frame))
                if messages[-1]["type"] == "start":  # the agent's reply: half a second of sound
                    await ws.send(agent.tobytes())

    async def main():
        async with serve(handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            return await play_call(f"ws://127.0.0.1:{port}/ws", "native", case.audio, case.rate,
                                   params=call_params(case, None), settle_s=0.3, quiet_s=0.2, fetch_record=False,
                                   echo=caller_echo(case))

    asyncio.run(main())
    assert messages[0]["echo"] == "true"
    heard = np.frombuffer(b"".join(received), dtype="<i2").astype(float)
    onset = int(np.flatnonzero(heard)[0])
    assert onset >= int(0.15 * RATE)  # never before the echo path's delay (the reply played from 0 s at the soonest)
    steady = heard[onset + int(0.04 * RATE):onset + int(0.45 * RATE)]  # every reflection in, the reply still playing
    level = 10 * np.log10(np.mean(steady**2) / np.mean(agent.astype(float) ** 2))
    assert -11.5 < level < -8.5, level
    assert not heard[onset + int(0.55 * RATE):].any()  # the reply's echo ends with it


def test_each_call_gets_a_fresh_speakerphone_at_its_lines_rate(tmp_path) -> None:
    echo = '[echo]\ndelay_ms = 150\nlevel_db = -10\n'
    twilio = load_case(write_case(tmp_path / "t", '[call]\ntransport = "twilio"\n' + echo))
    native = load_case(write_case(tmp_path / "n", '[call]\ntransport = "native"\n' + echo))
    first, second = caller_echo(twilio), caller_echo(twilio)
    assert first is not second and (first.rate, caller_echo(native).rate) == (8000, 16000)
    assert caller_echo(load_case(write_case(tmp_path / "plain"))) is None
