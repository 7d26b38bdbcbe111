"""A call's tools (`calls.tools`, `calls.webhook_tools`): what the model is offered, running the calls it makes,
and what they leave to do once the reply has played.

A reply that calls a tool runs it (an early reply waits for its end of turn first: nothing a caller might still
take back has an effect), speaks `calls.tool_filler` if it takes longer than `calls.tool_filler_ms`, and goes on
with the result as a "tool" message: the next generation of the same reply speaks. Errors and timeouts are
results too (`{"error": ...}`): the model talks about them and the call goes on. Built-ins: `end_call` and
`transfer_call` act after the reply's words have played (hang up; the native protocol's `transfer` event, the
transfer webhook, then hang up), `send_dtmf` sends digits where the transport can."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from voicepipe.config import CallSettings
from voicepipe.llm.tools import ToolCall, ToolSpec
from voicepipe.pipeline.call_types import _Reply
from voicepipe.pipeline.webhooks import ToolError, WebhookAnswer, call_webhook, post_json

log = logging.getLogger("voicepipe.pipeline.session")  # the call's log lines keep the session's logger

_DIGITS = {"type": "string", "pattern": "^[0-9*#A-D]{1,32}$", "description": "the keys to press, e.g. 1234#"}


def builtin_specs(cfg: CallSettings, can_send_dtmf: bool) -> dict[str, ToolSpec]:
    """The built-in tools as the model sees them (send_dtmf only where the transport can send digits)."""
    transfer_args: dict[str, Any] = {"type": "object", "properties": {}}
    if cfg.transfer_target is None:
        transfer_args = {"type": "object", "required": ["target"], "properties": {"target": {
            "type": "string", "maxLength": 64, "description": "the number or department to transfer to"}}}
    specs = {
        "end_call": ToolSpec("end_call", "Hang up the phone once you have said goodbye. Use it when the caller says "
                             "goodbye or has nothing more to ask.", {"type": "object", "properties": {}}),
        "transfer_call": ToolSpec("transfer_call", "Transfer the caller to a human or another department.",
                                  transfer_args),
    }
    if can_send_dtmf:
        specs["send_dtmf"] = ToolSpec("send_dtmf", "Press keys on the phone's keypad (to navigate a phone menu).",
                                      {"type": "object", "required": ["digits"], "properties": {"digits": _DIGITS}})
    return specs


def call_tools(cfg: CallSettings, can_send_dtmf: bool, params: dict[str, Any]) -> tuple[list[ToolSpec], str]:
    """The tools a call offers and its tool_choice: the settings', narrowed by the call's `tools` parameter and
    its `tool_choice` when `calls.allow_overrides` (names it does not know are logged and left out)."""
    builtins = builtin_specs(cfg, can_send_dtmf)
    offered = [builtins[n] for n in cfg.tools if n in builtins]
    offered += [ToolSpec(t.name, t.description, t.parameters) for t in cfg.webhook_tools]
    choice = cfg.tool_choice
    if cfg.allow_overrides:
        wanted = params.get("tools")
        if isinstance(wanted, str):
            wanted = [w.strip() for w in wanted.split(",") if w.strip()]
        if isinstance(wanted, list):
            unknown = [w for w in wanted if w not in {t.name for t in offered}]
            if unknown:
                log.info("the call's tools parameter names unknown tools: %s", unknown)
            offered = [t for t in offered if t.name in wanted]
        if isinstance(params.get("tool_choice"), str):
            choice = params["tool_choice"]
    if choice not in ("auto", "required", "none") and choice not in {t.name for t in offered}:
        log.info("the call's tool_choice %r is not one of its tools: auto instead", choice)
        choice = "auto"
    return offered, choice if offered else "none"


class ToolCalls:
    """CallSession's tool machinery (a mixin).

    Reads `cfg`, `tools`, `tool_choice`, `output`, `record`, `call_id`, `_since`; writes `reply.after` and
    `record.tool_calls`; uses `note`, `_emit` and the `ended` event with `end_reason`."""

    def _tool_options(self, rounds_done: int = 0, prefix: str = "") -> dict[str, Any]:
        """What a generation of a reply passes the engine: its token budget, the tools, and the choice for its round
        (the first follows the call's tool_choice; after a call "auto" stays "auto", anything else answers in
        words, as does the last round and a reply that starts with a tool's `say`). A round that must call gets
        `calls.max_tool_call_tokens`; one that may answer in words keeps `calls.max_reply_tokens`."""
        budget = {"max_tokens": self.cfg.max_reply_tokens}
        if not self.tools:
            return budget
        choice = self.tool_choice
        if rounds_done:
            last = rounds_done >= self.cfg.max_tool_rounds
            choice = "auto" if choice == "auto" and not last and not prefix else "none"
        if choice not in ("auto", "none"):
            budget["max_tokens"] = max(self.cfg.max_reply_tokens, self.cfg.max_tool_call_tokens)
        return {**budget, "tools": self.tools, "tool_choice": choice, "reply_prefix": prefix}

    async def _call_tools(self, reply: _Reply, calls: list[ToolCall]) -> tuple[list[dict[str, str]], str]:
        """Run the reply's tool calls; returns the messages for its next generation and the text to start it with."""
        if reply.held:  # an early reply: nothing happens before the end of turn confirms it
            await reply.release.wait()
        messages, say = [], ""
        for call in calls:
            answer = await self._run_tool(reply, call)
            messages.append({"role": "tool", "content": answer.result})
            say = say or answer.say
        return messages, say

    async def _run_tool(self, reply: _Reply, call: ToolCall) -> WebhookAnswer:
        record = reply.record
        started = time.monotonic()
        entry: dict[str, Any] = {"name": call.name, "arguments": call.arguments, "t": self._since(started),
                                 "latency_ms": None, "result_chars": 0, "error": None}
        record.tool_calls.append(entry)
        record.timeline.setdefault("tool_call", entry["t"])
        self.note("tool_call", turn=reply.turn, name=call.name, arguments=call.arguments)
        log.info("call %s: turn %d calls %s(%s)", self.call_id, reply.turn, call.name, call.arguments)
        task = asyncio.ensure_future(self._tool_answer(reply, call))
        try:
            if self.cfg.tool_filler_ms and self.cfg.tool_filler:
                done, _ = await asyncio.wait({task}, timeout=self.cfg.tool_filler_ms / 1000)
                if not done:
                    self._say_filler(reply)
            answer = await task
        except ToolError as exc:
            entry["error"] = str(exc)
            answer = WebhookAnswer(json.dumps({"error": f"{call.name} failed: {exc}"}))
            log.warning("call %s: tool %s failed: %s", self.call_id, call.name, exc)
        except asyncio.CancelledError:  # the caller barged in, or hung up
            entry["error"] = "cancelled: the reply was interrupted"
            raise
        finally:
            if not task.done():
                task.cancel()
            entry["latency_ms"] = round((time.monotonic() - started) * 1000, 1)
        entry["result_chars"] = len(answer.result)
        record.timeline.setdefault("tool_result", self._since())
        self.note("tool_result", turn=reply.turn, name=call.name, latency_ms=entry["latency_ms"],
                  result=answer.result[:200], error=entry["error"])
        return answer

    def _say_filler(self, reply: _Reply) -> None:
        """The tool is slow: the caller hears the filler meanwhile (it is part of what the reply said)."""
        text = ("" if not reply.text or reply.text.endswith(" ") else " ") + self.cfg.tool_filler + " "
        reply.text += text
        reply.stream.push_text(text)  # the space after its full stop ends the sentence: it is spoken now
        self.note("tool_filler", turn=reply.turn, text=self.cfg.tool_filler)

    async def _tool_answer(self, reply: _Reply, call: ToolCall) -> WebhookAnswer:
        if not call.complete:
            raise ToolError(f"the call was cut short at {self.cfg.max_tool_call_tokens} tokens")
        args = call.parsed()
        if call.name == "end_call":
            reply.after = ("end_call", None)
            return WebhookAnswer(json.dumps({"ok": True, "note": "the call ends once you have said goodbye"}))
        if call.name == "transfer_call":
            target = self.cfg.transfer_target or str(args.get("target", "")).strip()
            if not target:
                raise ToolError("no target to transfer to")
            reply.after = ("transfer_call", target)
            return WebhookAnswer(json.dumps({"ok": True, "note": f"the caller is transferred to {target} once you "
                                             "have told them"}))
        if call.name == "send_dtmf":
            digits = str(args.get("digits", ""))
            if not self.output_can_send_dtmf():
                raise ToolError("this line cannot send keys")
            self.output.send_dtmf(digits)
            self.note("dtmf_sent", turn=reply.turn, digits=digits)
            return WebhookAnswer(json.dumps({"ok": True, "sent": digits}))
        tool = next((t for t in self.cfg.webhook_tools if t.name == call.name), None)
        if tool is None:
            raise ToolError("no such tool")
        payload = {"call_id": self.call_id, "transport": self.record.transport, "tool": call.name,
                   "arguments": args, "metadata": self.record.metadata}
        headers = {name: value.get_secret_value() for name, value in tool.headers.items()}
        return await call_webhook(tool.url, payload, tool.timeout_s, headers, self.cfg.tool_result_chars)

    def output_can_send_dtmf(self) -> bool:
        return bool(getattr(self.output, "can_send_dtmf", False))

    async def _act_after_reply(self, reply: _Reply) -> None:
        """The reply has played: hang up, or transfer then hang up, if one of its tools asked to."""
        if reply.after is None or self.closed:
            return
        action, target = reply.after
        if action == "transfer_call":
            await self._transfer(target)
        log.info("call %s: the agent ends the call (%s)", self.call_id, action)
        self.end_reason = "transferred" if action == "transfer_call" else "agent_hangup"
        self.ended.set()

    async def _transfer(self, target: str) -> None:
        self.transfer_target = target  # a SIP dialog REFERs the phone to it as the call ends
        self.note("transfer", target=target)
        self._emit("transfer", {"target": target})
        url = self.cfg.transfer_webhook
        if url is None:
            return
        payload = {"call_id": self.call_id, "transport": self.record.transport, "target": target,
                   "metadata": self.record.metadata}
        try:
            await post_json(url, payload, self.cfg.transfer_timeout_s)
        except ToolError as exc:
            log.warning("call %s: the transfer webhook failed: %s", self.call_id, exc)
            self.note("transfer_failed", target=target, error=str(exc))
