"""The call client's continuous mode (what replay plays): the whole caller channel goes out once, in order, at
real-time pace, whatever the agent does; its per-frame send lag is measured. Against a loopback WebSocket server
that speaks the native protocol and notes when each frame arrives."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np

from voicepipe.caller import play_call

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
