"""Agents that act, in real calls with the real default models: keypad entries reach the LLM as a turn (over a
provider's DTMF message and as RFC 4733 events on WebRTC), the agent hangs up after its goodbye (over a WebSocket
provider and AudioSocket), and webhook tools are called against a local HTTP server: the result is spoken, a slow
one gets the filler, a failing one is reported to the model and the call goes on.

The default model (SmolLM2-135M) does not call tools on its own (README, "What a small model can do"), so these
calls force the tool with their `tool_choice` parameter: what is under test is everything around the model's call.
One server and one webhook server serve the module.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import jsonschema
import pytest

from tests.call_helpers import call_settings
from tests.e2e.test_call_transports import speak, ws_url
from tests.net_helpers import in_process_server
from tests.webhook_server import Route, webhook_server
from voicepipe.caller import keypad, run_call

pytestmark = pytest.mark.e2e

ORDER_ARGS = {"type": "object", "additionalProperties": False, "required": ["order_id"],
              "properties": {"order_id": {"type": "string", "pattern": "^[0-9]{1,8}$"}}}
SAY = "Your order has shipped and arrives on Friday."
FILLER = "One moment please."
ROUTES = {"/orders": Route(json.dumps({"status": "shipped", "arrives": "Friday", "say": SAY})),
          "/slow": Route(json.dumps({"status": "late"}), delay_s=2.5),
          "/broken": Route("database down", 500, content_type="text/plain")}


@pytest.fixture(scope="module")
def hooks():
    with webhook_server(ROUTES) as hooks:
        yield hooks


@pytest.fixture(scope="module")
def server(tmp_path_factory, hooks):
    tools = [{"name": name, "description": "Look up an order's status by its number.", "parameters": ORDER_ARGS,
              "url": hooks.url(path), "timeout_s": 5.0}
             for name, path in (("lookup_order", "/orders"), ("slow_lookup", "/slow"), ("broken_lookup", "/broken"))]
    settings = call_settings(tmp_path_factory.mktemp("tools-server"),
                             calls={"greeting": None, "audiosocket_port": 0, "tools": ["end_call"],
                                    "tool_choice": "end_call",  # AudioSocket calls carry no parameters
                                    "webhook_tools": tools, "tool_filler": FILLER, "tool_filler_ms": 600,
                                    "max_reply_tokens": 24})
    with in_process_server(settings) as (base, app):
        yield base.replace("http://", "ws://"), app


def forced(tool: str) -> dict:
    return {"tools": tool, "tool_choice": tool}


@pytest.mark.parametrize("transport", ["twilio", "audiosocket"])
def test_the_caller_says_goodbye_and_the_agent_hangs_up_after_its_own(server, voice_dir: Path, transport: str):
    base, app = server
    result = asyncio.run(run_call(ws_url(base, transport, app), transport, [speak("Thank you, goodbye!", voice_dir)],
                                  params=forced("end_call"), quiet_s=4.0, record_url=base.replace("ws://", "http://")))
    (turn,) = result.turns
    assert turn.audio_s > 0.3, "the agent hung up without a goodbye"
    record = result.record
    assert record["end_reason"] == "agent_hangup" and record["outcome"] == "completed"
    (stored,) = record["turns"]
    assert [c["name"] for c in stored["tool_calls"]] == ["end_call"] and stored["tool_calls"][0]["error"] is None
    assert stored["agent_text"].strip() and "playout_end" in stored["timeline"]  # it finished its sentence first
    if transport == "audiosocket":
        assert result.server_hangup is not None and result.server_hangup > turn.last_audio  # its hangup frame
    else:
        assert result.close_code == 1000 and result.close_reason == "agent_hangup"
    assert not app.state.calls.active


@pytest.mark.parametrize("transport", ["twilio", "webrtc"])
def test_a_keypad_entry_reaches_the_llm_as_a_turn(server, transport: str):
    base, app = server
    url = base.replace("ws://", "http://") if transport == "webrtc" else ws_url(base, transport)
    result = asyncio.run(run_call(url, transport, [keypad("4217#")], params={"tools": ""}, quiet_s=0.8,
                                  record_url=base.replace("ws://", "http://")))
    (turn,) = result.turns
    assert turn.audio_s > 0.3, "no answer to the keys"
    (stored,) = result.record["turns"]
    assert stored["dtmf"] == "4217" and stored["user_text"] == "[keypad: 4 2 1 7]" and stored["agent_text"]
    assert {"role": "user", "content": "[keypad: 4 2 1 7]"} in result.record["history"]
    assert stored["timings_ms"]["dtmf_response"] > 0
    # the client's own view: from the # key sent to the first agent audio received
    assert turn.voice_to_voice_ms is not None and turn.voice_to_voice_ms < 20000
    assert not app.state.calls.active


def tool_call(base: str, voice_dir: Path, tool: str, sentences: list[str], quiet_s: float = 0.8):
    return asyncio.run(run_call(ws_url(base, "native"), "native", [speak(s, voice_dir) for s in sentences],
                                params=forced(tool), quiet_s=quiet_s, reply_timeout_s=90))


def test_a_webhook_tool_is_called_and_its_result_is_spoken(server, hooks, voice_dir: Path):
    base, _ = server
    before = len(hooks.bodies("/orders"))
    # quiet_s: a loaded machine may leave gaps in the reply's audio; the caller waits them out before hanging up
    result = tool_call(base, voice_dir, "lookup_order", ["Where is my order 4217?"], quiet_s=3.0)
    (body,) = hooks.bodies("/orders")[before:]
    assert body["tool"] == "lookup_order" and body["transport"] == "native"
    jsonschema.validate(body["arguments"], ORDER_ARGS)
    (stored,) = result.record["turns"]
    (entry,) = stored["tool_calls"]
    assert entry["error"] is None and json.loads(entry["arguments"]) == body["arguments"]
    assert stored["agent_text"].startswith(SAY)
    assert result.turns[0].audio_s > 2.0, "the result was not spoken"  # the sentence alone is about 2.5 s
    tool_messages = [m for m in result.record["history"] if m["role"] == "tool"]
    assert len(tool_messages) == 1 and json.loads(tool_messages[0]["content"])["say"] == SAY
    assert stored["timeline"]["tool_call"] <= stored["timeline"]["tool_result"] <= stored["timeline"][
        "first_audio_sent"]


def test_a_slow_webhook_gets_the_filler(server, voice_dir: Path):
    base, _ = server
    result = tool_call(base, voice_dir, "slow_lookup", ["Where is my order 4217?"], quiet_s=4.0)  # waits it out
    (stored,) = result.record["turns"]
    assert stored["agent_text"].startswith(FILLER) and stored["tool_calls"][0]["latency_ms"] >= 2500
    timeline = stored["timeline"]
    assert timeline["first_audio_sent"] < timeline["tool_result"], "the caller heard nothing while the tool ran"


def test_a_failing_webhook_is_reported_to_the_model_and_the_call_goes_on(server, voice_dir: Path):
    base, app = server
    result = tool_call(base, voice_dir, "broken_lookup", ["Where is my order 4217?", "What is the capital of France?"])
    first, second = result.record["turns"]
    assert first["tool_calls"][0]["error"] == "the service answered HTTP 500: database down"
    assert first["error"] is None and first["agent_text"].strip()
    errors = [json.loads(m["content"])["error"] for m in result.record["history"] if m["role"] == "tool"]
    assert errors and "broken_lookup failed" in errors[0]
    assert second["agent_text"].strip() and "capital" in second["user_text"].lower()
    assert [t.audio_s > 0.3 for t in result.turns] == [True, True]
    assert result.record["end_reason"] != "agent_hangup" and result.record["outcome"] == "completed"
    assert not app.state.calls.active
