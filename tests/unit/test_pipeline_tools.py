"""A call's tools (voicepipe/pipeline/tool_calls.py) with the session's scripted models and a local HTTP server for
the webhooks: a call the model makes is run, its result goes back as a tool message and the reply goes on; slow
tools get the filler, failing ones are reported to the model; end_call and transfer_call act once the reply has
played; nothing happens for an early reply the caller has not confirmed."""

from __future__ import annotations

import asyncio
import json

from tests.unit.test_pipeline_session import FakeOutput, Harness, run
from tests.webhook_server import Route, webhook_server
from voicepipe.config import CallSettings, WebhookTool
from voicepipe.llm.tools import ToolCall
from voicepipe.pipeline import CallState
from voicepipe.pipeline.tool_calls import call_tools

ORDER_ARGS = {"type": "object", "required": ["order_id"], "properties": {"order_id": {"type": "string"}}}


def lookup(url: str, timeout_s: float = 2.0) -> WebhookTool:
    return WebhookTool(name="lookup_order", description="Find an order.", parameters=ORDER_ARGS, url=url,
                       timeout_s=timeout_s, headers={"x-key": "k"})


def call(name: str, arguments: str = "{}") -> ToolCall:
    return ToolCall(f"call_{name}", name, arguments)


async def played_out(h: Harness, replies: int = 1) -> None:
    await h.settle(lambda: h.output.ended_replies >= replies, timeout=5)
    h.output.playing = False


def test_a_webhook_tools_result_goes_back_to_the_model_and_its_say_starts_the_reply() -> None:
    answer = json.dumps({"status": "shipped", "say": "Order 4217 has shipped."})
    with webhook_server({"/orders": Route(answer)}) as hooks:
        async def main():
            h = Harness(webhook_tools=[lookup(hooks.url("/orders"))], tool_choice="lookup_order",
                        params={"account": "A-1"})
            h.engine.tool_script = [call("lookup_order", '{"order_id":"4217"}')]
            await h.call.start()
            await h.one_turn()
            await played_out(h)
            await h.settle(lambda: h.call.state is CallState.LISTENING)
            (body,) = hooks.bodies("/orders")
            assert hooks.headers[0]["x-key"] == "k" and hooks.headers[0]["content-type"] == "application/json"
            assert body == {"call_id": h.call.call_id, "transport": "native", "tool": "lookup_order",
                            "arguments": {"order_id": "4217"}, "metadata": {"account": "A-1"}}
            assert h.engine.calls[1] == [{"role": "tool", "content": answer}]
            first, follow = h.engine.tool_options
            assert first["tool_choice"] == "lookup_order" and [t.name for t in first["tools"]] == ["lookup_order"]
            assert follow["tool_choice"] == "none" and follow["reply_prefix"] == "Order 4217 has shipped."
            (turn,) = h.call.record.turns
            assert turn.agent_text.startswith("Order 4217 has shipped.")
            (entry,) = turn.tool_calls
            assert entry["name"] == "lookup_order" and entry["error"] is None
            assert entry["result_chars"] == len(answer) and entry["latency_ms"] >= 0
            assert turn.timeline["tool_call"] <= turn.timeline["tool_result"] <= turn.timeline["first_audio_sent"]
            assert "tool" in turn.timings_ms
            assert turn.output_tokens == 4 + 5  # both generations: the forced "say" and the model's own words
            kinds = [e["type"] for e in h.observer.events]
            assert kinds.index("tool_call") < kinds.index("tool_result")
            assert not h.call.ended.is_set()
            await h.call.close()

        run(main())


def test_a_slow_tool_gets_the_filler_and_a_failing_or_timed_out_one_is_a_result_not_a_failure() -> None:
    routes = {"/slow": Route('{"status": "late"}', delay_s=0.3), "/fail": Route("boom", 500, content_type="text/plain"),
              "/hang": Route("{}", delay_s=1.0)}
    with webhook_server(routes) as hooks:
        async def one(path: str, timeout_s: float = 2.0):
            h = Harness(webhook_tools=[lookup(hooks.url(path), timeout_s)], tool_choice="lookup_order",
                        tool_filler_ms=100, tool_filler="One moment, please.")
            h.engine.tool_script = [call("lookup_order", '{"order_id":"1"}')]
            await h.call.start()
            h.speak(400)
            await h.settle(lambda: h.call.state is CallState.SPEAKING or h.call.record.turns[0].tool_calls
                           and h.call.record.turns[0].tool_calls[0]["latency_ms"] is not None, timeout=5)
            await played_out(h)
            await h.settle(lambda: h.call.state is CallState.LISTENING, timeout=5)
            turn = h.call.record.turns[0]
            await h.call.close()
            return h, turn

        async def main():
            h, slow = await one("/slow")
            assert slow.agent_text.startswith("One moment, please. Hello there")
            assert slow.tool_calls[0]["error"] is None and slow.tool_calls[0]["latency_ms"] >= 300
            assert slow.timeline["first_audio_sent"] < slow.timeline["tool_result"]  # heard while the tool ran
            assert any(e["type"] == "tool_filler" for e in h.observer.events)

            h, failed = await one("/fail")
            assert failed.tool_calls[0]["error"] == "the service answered HTTP 500: boom"
            (message,) = h.engine.calls[1]
            assert message["role"] == "tool" and "lookup_order failed" in json.loads(message["content"])["error"]
            assert failed.agent_text and failed.error is None  # the model talks about it; the turn did not fail

            h, hung = await one("/hang", timeout_s=0.2)
            assert hung.tool_calls[0]["error"] == "no answer within 0.2 s"
            assert hung.agent_text.startswith("One moment, please.")

        run(main())


def test_end_call_hangs_up_once_the_goodbye_has_played() -> None:
    async def main():
        h = Harness(tools=["end_call"], tool_choice="end_call")
        h.engine.reply = "Goodbye, have a nice day."
        h.engine.tool_script = [call("end_call")]
        await h.call.start()
        await h.one_turn()
        await h.settle(lambda: h.output.ended_replies == 1)
        await asyncio.sleep(0.05)
        assert not h.call.ended.is_set()  # not while the goodbye is still playing
        h.output.playing = False
        await asyncio.wait_for(h.call.ended.wait(), 2)
        assert h.call.end_reason == "agent_hangup"
        turn = h.call.record.turns[0]
        assert turn.agent_text == "Goodbye, have a nice day." and turn.tool_calls[0]["name"] == "end_call"
        assert "playout_end" in turn.timeline
        await h.call.close(h.call.end_reason)
        assert h.call.record.outcome == "completed" and h.call.record.end_reason == "agent_hangup"

    run(main())


def test_transfer_sends_the_event_and_the_webhook_then_hangs_up() -> None:
    with webhook_server({"/bridge": Route("{}")}) as hooks:
        async def main():
            h = Harness(tools=["transfer_call", "end_call"], tool_choice="required",
                        transfer_webhook=hooks.url("/bridge"), params={"CallSid": "CA1"})
            h.engine.tool_script = [call("transfer_call", '{"target":"sales"}')]
            await h.call.start()
            await h.one_turn()
            await played_out(h)
            await asyncio.wait_for(h.call.ended.wait(), 2)
            assert h.call.end_reason == "transferred"
            assert ("transfer", {"target": "sales"}) in h.output.events
            assert hooks.bodies("/bridge") == [{"call_id": h.call.call_id, "transport": "native", "target": "sales",
                                                "metadata": {"CallSid": "CA1"}}]
            await h.call.close(h.call.end_reason)

        run(main())


def test_send_dtmf_is_offered_only_where_the_line_takes_keys() -> None:
    class KeyOutput(FakeOutput):
        can_send_dtmf = True

        def __init__(self) -> None:
            super().__init__()
            self.sent: list[str] = []

        def send_dtmf(self, digits: str) -> None:
            self.sent.append(digits)

    cfg = CallSettings(tools=["end_call", "send_dtmf"])
    assert [t.name for t in call_tools(cfg, False, {})[0]] == ["end_call"]
    assert [t.name for t in call_tools(cfg, True, {})[0]] == ["end_call", "send_dtmf"]

    async def main():
        h = Harness(tools=["send_dtmf"], tool_choice="send_dtmf")
        output = KeyOutput()
        output.call = h.call
        h.call.output = output
        h.call.tools, h.call.tool_choice = call_tools(h.call.cfg, True, {})
        h.output = output
        h.engine.tool_script = [call("send_dtmf", '{"digits":"12#"}')]
        await h.call.start()
        await h.one_turn()
        await h.settle(lambda: output.sent)
        assert output.sent == ["12#"]
        await h.call.close()

    run(main())


def test_a_calls_parameters_narrow_its_tools_and_choose_how_they_are_used() -> None:
    cfg = CallSettings(tools=["end_call", "transfer_call"], transfer_target="+15550100")
    tools, choice = call_tools(cfg, False, {"tools": "end_call", "tool_choice": "end_call"})
    assert [t.name for t in tools] == ["end_call"] and choice == "end_call"
    tools, choice = call_tools(cfg, False, {"tool_choice": "pizza"})
    assert len(tools) == 2 and choice == "auto"
    assert tools[1].schema == {"type": "object", "properties": {}}  # the target is set: the model names none
    assert call_tools(CallSettings(), False, {"tool_choice": "required"}) == ([], "none")
    cfg.allow_overrides = False
    assert len(call_tools(cfg, False, {"tools": ["end_call"]})[0]) == 2


def test_an_early_reply_runs_no_tool_until_its_end_of_turn_and_none_if_dropped() -> None:
    with webhook_server({"/orders": Route("{}")}) as hooks:
        async def main():
            h = Harness(webhook_tools=[lookup(hooks.url("/orders"))], tool_choice="lookup_order",
                        texts=["where is my", "where is my order"])
            h.engine.tool_script = [call("lookup_order", '{"order_id":"1"}'), call("lookup_order", '{"order_id":"2"}')]
            await h.call.start()
            h.push(20, h.ev("speech_start"))
            h.push(300)
            h.push(20, h.ev("speech_end"))  # the early reply calls the tool...
            await h.settle(lambda: h.engine.calls)
            await asyncio.sleep(0.2)
            assert hooks.requests == []  # ...which waits for the end of turn
            h.push(20, h.ev("speech_start"))  # the caller goes on: the early reply is dropped, the call never made
            h.push(300)
            h.push(20, h.ev("speech_end"))
            h.push(20, h.ev("end_of_turn"))
            await h.settle(lambda: hooks.requests, timeout=5)
            assert [body["arguments"] for body in hooks.bodies("/orders")] == [{"order_id": "2"}]
            await h.call.close()

        run(main())


def test_a_call_cut_short_by_its_budget_is_not_made() -> None:
    with webhook_server({"/orders": Route("{}")}) as hooks:
        async def main():
            h = Harness(webhook_tools=[lookup(hooks.url("/orders"))], tool_choice="lookup_order",
                        max_tool_call_tokens=32, max_reply_tokens=20)
            h.engine.tool_script = [call("lookup_order", '{"order_id":"42')]  # max_tokens ran out mid-string
            await h.call.start()
            await h.one_turn()
            await played_out(h)
            await h.settle(lambda: h.call.state is CallState.LISTENING)
            assert hooks.requests == []
            assert h.call.record.turns[0].tool_calls[0]["error"] == "the call was cut short at 32 tokens"
            assert [o["max_tokens"] for o in h.engine.tool_options] == [32, 20]  # the forced call, then words
            await h.call.close()

        run(main())
