"""The gateway's `Connection` and the call registry: a call that has ended is never listed as live.

The models are the scripted stand-ins of `test_pipeline_session` (real ones run in tests/e2e); the WebSocket is a
fake whose client has stopped reading, so the goodbye flush hangs for its whole 2 s bound, as it can for a real
provider or an AudioSocket peer that has gone away.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.pipeline_fakes import FakeDetector, fake_call_resources
from voicepipe.config import Settings
from voicepipe.pipeline import CallRegistry, CallSession
from voicepipe.transports.connection import Connection
from voicepipe.transports.serializers import make_serializer

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "transports" / "twilio" / "inbound.json"


def twilio_frame(event: str) -> dict:
    frames = json.loads(FIXTURE.read_text())["frames"]
    return {"type": "websocket.receive", "text": json.dumps(next(f["data"] for f in frames
                                                                if f["data"].get("event") == event))}


class DeafSocket:
    """A WebSocket whose peer sends what the test queues and never reads what the server sends."""

    def __init__(self) -> None:
        self.inbound: asyncio.Queue[dict] = asyncio.Queue()
        self.send_blocked = asyncio.Event()
        self.closed_with: tuple[int, str] | None = None

    async def receive(self) -> dict:
        return await self.inbound.get()

    async def send_text(self, text: str) -> None:
        self.send_blocked.set()
        await asyncio.Event().wait()

    send_bytes = send_text

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.closed_with = (code, reason)


@pytest.fixture(autouse=True)
def scripted_vad(monkeypatch):
    monkeypatch.setattr(CallSession, "_make_detector", lambda self: FakeDetector())


def test_a_hung_up_call_leaves_the_live_calls_before_the_goodbye_flush_ends() -> None:
    async def main():
        ws, registry = DeafSocket(), CallRegistry()
        conn = Connection(ws, "twilio", make_serializer("twilio"), Settings(), fake_call_resources(), registry)
        run = asyncio.create_task(conn.run())
        await ws.inbound.put(twilio_frame("start"))
        await asyncio.wait_for(ws.send_blocked.wait(), 5)  # the greeting's audio is stuck in the send
        [call_id] = registry.active
        call = registry.active[call_id]

        await ws.inbound.put(twilio_frame("stop"))
        await asyncio.wait_for(call.ended.wait(), 5)
        assert call.record.ended is not None and call.record.end_reason == "stop"
        assert not run.done(), "the flush should still be waiting on the deaf client"
        assert call_id not in registry.active, "an ended call is still listed as live"
        assert registry.get(call_id) is call.record

        await asyncio.wait_for(run, 5)  # the flush gives up after its bound
        await conn.cleanup()
        assert ws.closed_with == (1000, "stop")
        assert registry.ended[call_id] is call.record and not registry.active

    asyncio.run(main())


def test_finishing_an_old_call_twice_leaves_a_new_call_with_its_id_live() -> None:
    settings = Settings()
    old = CallSession(fake_call_resources(), settings, None, input_rate=8000, call_id="CA1")
    new = CallSession(fake_call_resources(), settings, None, input_rate=8000, call_id="CA1")
    registry = CallRegistry()
    registry.add(old)
    registry.finish(old)
    registry.add(new)
    registry.finish(old)  # the old connection's cleanup, after the hang-up already finished it
    assert registry.active == {"CA1": new}
    assert registry.ended["CA1"] is old.record


def test_a_key_press_on_the_wire_reaches_the_call() -> None:
    """Twilio's `dtmf` message (the recorded fixture's): the digit goes to the call's keypad; with # it is a turn."""
    async def main():
        ws, registry = DeafSocket(), CallRegistry()
        settings = Settings()
        settings.calls.greeting = None
        conn = Connection(ws, "twilio", make_serializer("twilio"), settings, fake_call_resources(), registry)
        run = asyncio.create_task(conn.run())
        await ws.inbound.put(twilio_frame("start"))
        while not registry.active:
            await asyncio.sleep(0.01)
        call = next(iter(registry.active.values()))
        digit = json.loads(twilio_frame("dtmf")["text"])["dtmf"]["digit"]
        await ws.inbound.put(twilio_frame("dtmf"))
        hash_key = json.loads(twilio_frame("dtmf")["text"])
        hash_key["dtmf"]["digit"] = "#"
        await ws.inbound.put({"type": "websocket.receive", "text": json.dumps(hash_key)})
        while not call.record.turns:
            await asyncio.sleep(0.01)
        assert call.record.turns[0].dtmf == digit
        await conn.cleanup()
        run.cancel()

    asyncio.run(main())
