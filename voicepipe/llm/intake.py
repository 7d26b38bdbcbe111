"""The engine's request intake and session API (a mixin of `LLMEngine`): open, close, truncate, drop turns, roll
back and read sessions; render, tokenize, compact and submit requests; warm a session's next turn.

Everything here runs on the caller's thread and changes sessions and the scheduler under the engine's lock; the
engine thread (`step_loop.py`) does the rest."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from typing import Any

from voicepipe.llm.chat import validate_messages
from voicepipe.llm.constraints import ToolConstraint
from voicepipe.llm.errors import (
    ContextOverflowError,
    EmptyMessagesError,
    EngineStoppedError,
    InvalidRequestError,
    SessionBusyError,
    SessionClosedError,
)
from voicepipe.llm.generation import Generation
from voicepipe.llm.request import TIER_RANK, Request, RequestStats, tier_rank
from voicepipe.llm.sampling import SamplingParams, make_generator
from voicepipe.llm.session import Session, TurnMark
from voicepipe.llm.tools import CallSplitter, call_grammar, messages_with_tools, parse_tools, resolve_choice

log = logging.getLogger("voicepipe.llm.engine")  # the engine's log lines keep its logger name

END_PUNCTUATION = " \t\n.,;:!?…"  # stripped from a user message's end before the end probe


class RequestIntake:
    """LLMEngine's request intake and session API (a mixin).

    Reads `settings`, `tokenizer`, `renderer`, `max_context`, `context_budget`, `model_stop_ids` and `end_ids`;
    under `_lock` it reads and writes `_sessions`, the sessions themselves, `scheduler` (submits, forgets, warms),
    `blocks` (a cut frees blocks) and `counters`, and checks `_thread` and `_running`."""

    def _end_of_message_ids(self) -> list[int]:
        """The tokens that end a user message where it stands: the chat template's end-of-message token (what follows
        a user message's content) and sentence-final punctuation. A small instruct model puts most of the weight
        of a finished sentence on its full stop or question mark rather than straight on the end-of-message token."""
        ids = set()
        for mark in (".", "?", "!"):
            encoded = self.renderer.encode(mark)
            if len(encoded) == 1:
                ids.add(encoded[0])
        try:
            text = self.renderer.render([{"role": "user", "content": "x"}], add_generation_prompt=False)
            after = self.renderer.encode(text[text.rindex("x") + 1:])
            if after:
                ids.add(after[0])
        except Exception:  # a template that will not render a lone user message: punctuation alone
            log.debug("no end-of-message token from the chat template", exc_info=True)
        return sorted(ids)

    # -- sessions -------------------------------------------------------------------------------------------------
    def open_session(self, system_prompt: str | None = None) -> Session:
        """A new conversation. ``system_prompt`` becomes its first message (rendered with the first turn)."""
        session = Session(system_prompt=system_prompt)
        with self._lock:
            self._sessions[session.id] = session
        return session

    def close_session(self, session: Session) -> None:
        """Release the session's blocks (a generation in flight is cancelled first)."""
        with self._lock:
            if session.closed:
                return
            session.closed = True
            self._sessions.pop(session.id, None)
            self.scheduler.forget_session(session)
            if session.busy:
                for req in self.scheduler.waiting + self.scheduler.running:
                    if req.session is session:
                        req.cancelled = True
                self._lock.notify_all()
            else:
                session.drop_kv(self.blocks)

    def truncate(self, session: Session, n_tokens: int) -> None:
        """Roll the session back to its first ``n_tokens`` ids: anywhere inside the last reply, or exactly at the
        start of an earlier turn (``session.marks``). Blocks past the cut are released."""
        with self._lock:
            self._check_idle(session)
            held = session.reply_end
            if not 0 <= n_tokens <= held:
                raise InvalidRequestError(f"cannot truncate to {n_tokens} tokens: the session holds {held}.",
                                          "pass a count between 0 and session.reply_end.")
            if session.reply_start is not None and n_tokens >= session.reply_start:
                session.truncate_kv(self.blocks, n_tokens)
                self._warm_next_turn(session)
                return
            marks = [m for m in session.marks if m.n_ids == n_tokens]
            if not marks:
                raise InvalidRequestError(
                    f"cannot truncate to {n_tokens} tokens: that is neither inside the last reply "
                    f"(from {session.reply_start}) nor the start of a turn.",
                    "cut inside the last reply, or at one of session.marks.")
            self._restore_mark(session, marks[-1])
            self._warm_next_turn(session)

    def _restore_mark(self, session: Session, mark: TurnMark) -> None:
        session.truncate_kv(self.blocks, mark.n_ids)
        session.messages = session.messages[:mark.n_messages]
        session.text = session.text[:mark.text_len]
        kept = session.marks.index(mark)
        session.requests -= len(session.marks) - kept  # one request per turn: the next turn gets its number back
        session.marks = session.marks[:kept]
        session.reply_start = None
        if not session.block_table:
            self.scheduler.forget_session(session)

    def drop_turns(self, session: Session, keep: int) -> None:
        """Forget every turn after the first ``keep`` (``len(session.marks)`` before they began): their messages,
        replies and KV. A call uses it for a reply it started early and then did not want."""
        with self._lock:
            self._check_idle(session)
            if 0 <= keep < len(session.marks):
                self._restore_mark(session, session.marks[keep])
                self._warm_next_turn(session)

    def rollback_reply(self, session: Session, heard_tokens: int) -> None:
        """Barge-in: keep only the first ``heard_tokens`` tokens of the last reply."""
        if session.reply_start is None:
            raise InvalidRequestError("the session has no reply to roll back.", "call it after a generation.")
        self.truncate(session, min(session.reply_end, session.reply_start + max(0, heard_tokens)))

    def history(self, session: Session) -> list[dict[str, str]]:
        """The conversation as messages, including the last reply (which ``session.messages`` only gets when the
        next turn starts, so that a barge-in rollback can still cut it)."""
        with self._lock:
            if session.busy:
                return list(session.messages)
            return self._settled(session)[0]

    def _check_idle(self, session: Session) -> None:
        if session.closed:
            raise SessionClosedError(f"session {session.id} is closed.", "open a new session.")
        if session.busy:
            raise SessionBusyError(f"session {session.id} has a generation in flight.",
                                   "cancel it or wait for it to end.")

    # -- requests -------------------------------------------------------------------------------------------------
    def generate(self, session: Session | None, new_messages: list[dict[str, str]], tier: str = "default",
                 params: SamplingParams | None = None, end_probe: bool = False, tools: Any = None,
                 tool_choice: Any = None, reply_prefix: str = "", **sampling: Any) -> Generation:
        """Start a reply to ``new_messages`` appended to ``session`` (None: a sessionless request whose messages
        are the whole conversation). Call it from the event loop; iterate the result with ``async for``.

        ``end_probe``: also compute, in the same prefill, P(the last user message ends where its words end): the
        probability of an end token (``end_ids``) after its content less trailing punctuation. It resolves
        ``Generation.end_prob`` (and ``stats.end_prob``) with the prefill step that reaches those words.

        ``tools`` (`ToolSpec`s or OpenAI's function tools) and ``tool_choice`` ("none", "auto", "required" or a
        tool's name; default "auto"): the reply may be, or must be, one call to a tool, with its arguments
        constrained to the tool's schema (see `tools.py`); `Generation.tool_calls` holds it. The tools are described
        in the system prompt of the first turn: a session's tools are the ones its first turn offered. A tool's
        result comes back as a message with role "tool".

        ``reply_prefix``: the reply starts with exactly this text (the grammar forces its tokens) and the model goes
        on from there; a call uses it to say a tool's result word for word."""
        params = self._params(params, sampling)
        tier_rank(tier)
        new = validate_messages(new_messages)
        specs = parse_tools(tools)
        choice = resolve_choice(tool_choice, specs)
        grammar = call_grammar(specs, choice, reply_prefix)
        if grammar is not None:
            if params.constraint is not None:
                raise InvalidRequestError("a reply cannot be both constrained JSON and a tool call.",
                                          "drop response_format or the tools.")
            params = dataclasses.replace(params, constraint=ToolConstraint(self.grammar_tokenizer, grammar,
                                                                           params.max_tokens))

        def prepare(session: Session, stats: RequestStats) -> int | None:
            self._settle_reply(session)
            msgs = new
            if not session.messages:  # the first turn renders the system prompt, which describes the tools
                system = session.system_prompt
                if system is not None and msgs[0]["role"] != "system":
                    msgs = [{"role": "system", "content": system}] + msgs
                msgs = messages_with_tools(msgs, specs)
            self._append_turn(session, msgs, params.max_tokens, stats)
            return self._probe_index(session, msgs) if end_probe else None

        return self._submit(session, prepare, tier, params, CallSplitter() if specs and choice != "none" else None)

    def _probe_index(self, session: Session, new: list[dict[str, str]]) -> int | None:
        """The index in ``session.ids`` of the last token of the last user message's words (its content less
        trailing punctuation), in the turn just appended; None when there are no words or the tokens of the words
        alone are not a prefix of the turn's tokens."""
        content = next((m["content"] for m in reversed(new) if m["role"] == "user"), "")
        words = content.rstrip(END_PUNCTUATION)
        if not words:
            return None
        base_ids, base_text = (session.marks[-1].n_ids, session.marks[-1].text_len) if session.marks else (0, 0)
        turn_text = session.text[base_text:]
        at = turn_text.rfind(content)
        if at < 0:
            return None
        head = self.renderer.encode(turn_text[:at + len(words)])
        if not head or session.ids[base_ids:base_ids + len(head)] != head:
            return None
        return base_ids + len(head) - 1

    def complete(self, prompt: str | list[int], tier: str = "default", params: SamplingParams | None = None,
                 **sampling: Any) -> Generation:
        """A raw completion of ``prompt`` (text, or token ids), without a chat template and without a session.
        Like every request it reuses cached blocks of any earlier request with the same prefix."""
        params = self._params(params, sampling)
        tier_rank(tier)
        if isinstance(prompt, str):
            if not prompt:
                raise EmptyMessagesError("the prompt is empty.", "send a non-empty prompt.")
            ids = self.tokenizer(prompt)["input_ids"]
        elif isinstance(prompt, (list, tuple)) and prompt and all(isinstance(t, int) for t in prompt):
            vocab = self.runner.vocab_size
            if any(t < 0 or t >= vocab for t in prompt):
                raise InvalidRequestError(f"a prompt token id is outside the vocabulary (0..{vocab - 1}).",
                                          "send token ids of this model.")
            ids = list(prompt)
        else:
            raise InvalidRequestError("the prompt must be a non-empty string or list of token ids.",
                                      "send prompt as text.")
        if len(ids) + params.max_tokens > self.context_budget:
            raise ContextOverflowError(
                f"the prompt ({len(ids)} tokens) plus max_tokens={params.max_tokens} exceeds the context budget of "
                f"{self.context_budget} tokens.", "send a shorter prompt or lower max_tokens.")

        def prepare(session: Session, stats: RequestStats) -> None:
            session.ids = ids
            session.text = prompt if isinstance(prompt, str) else ""
            return None

        return self._submit(None, prepare, tier, params)

    def _params(self, params: SamplingParams | None, sampling: dict[str, Any]) -> SamplingParams:
        if params is None:
            sampling.setdefault("max_tokens", self.settings.default_max_tokens)
            try:
                params = SamplingParams(**sampling)
            except TypeError as exc:
                raise InvalidRequestError(f"unknown sampling option: {exc}.", "see SamplingParams.") from None
        elif sampling:
            raise InvalidRequestError("pass either params or sampling keywords, not both.", "pick one.")
        params.validate()
        return params

    def _submit(self, session: Session | None, prepare, tier: str, params: SamplingParams,
                calls: CallSplitter | None = None) -> Generation:
        loop = asyncio.get_running_loop()
        if self._thread is None or not self._running:
            raise EngineStoppedError("the LLM engine is not running.", "call engine.start() first.")
        queue: asyncio.Queue = asyncio.Queue()
        with self._lock:
            if session is None:
                session = Session(ephemeral=True)
            self._check_idle(session)
            stats = RequestStats(arrival=time.monotonic())
            probe_at = prepare(session, stats)
            stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self.model_stop_ids)
            req = Request(session=session, params=params, tier=tier, stop_ids=stop_ids, stats=stats,
                          generator=make_generator(params, self.runner.device),
                          sink=(loop, queue), probe_at=probe_at, end_prob_future=loop.create_future(),
                          speculate=self.proposer is not None and params.greedy and params.constraint is None
                                    and params.logprobs is None)
            stats.prompt_tokens = len(session.ids)
            session.reply_start = len(session.ids)
            session.busy = True
            session.requests += 1
            self.counters["requests"] += 1
            if params.max_tokens == 0:
                self._finish(req, "length")
            else:
                self.scheduler.add(req)
                if self._step_abortable and req.rank < TIER_RANK["flex"]:
                    self.runner.cache.abort_requested = True
                self._lock.notify_all()
        return Generation(self, req, queue, list(params.stop), calls)

    def _settled(self, session: Session) -> tuple[list[dict[str, str]], str]:
        """The session's messages and rendered text with its last reply folded in (the reply is decoded here)."""
        if session.reply_start is None:
            return list(session.messages), session.text
        reply = session.ids[session.reply_start:session.reply_end]
        content_ids = reply[:-1] if reply and reply[-1] in self.model_stop_ids else reply
        content = self.tokenizer.decode(content_ids, skip_special_tokens=False)
        return ([*session.messages, {"role": "assistant", "content": content}],
                session.text + self.tokenizer.decode(reply, skip_special_tokens=False))

    def _settle_reply(self, session: Session) -> None:
        session.messages, session.text = self._settled(session)
        session.reply_start = None

    def prefill_user_words(self, session: Session, words: str) -> None:
        """The caller has said ``words`` (complete words) of their next message so far: while the session is idle,
        the engine prefills the next user turn up to them, so the turn itself has fewer tokens to prefill. A no-op
        while a generation is in flight. Later words replace earlier ones; the next turn keeps the longest prefix
        of them that its own rendering starts with (see ``_claim_opener``)."""
        with self._lock:
            self._warm_next_turn(session, words.strip())

    def _warm_next_turn(self, session: Session, user_words: str = "") -> None:
        """Hold what the next user turn is known to start with, for the scheduler to prefill while the session is
        idle (the reply's last sampled token is prefilled with it): the chat template's opener of a user turn and,
        with ``user_words``, the start of the message."""
        if not self.settings.warm_next_turn or session.busy or session.closed or session.ephemeral:
            return
        messages, text = self._settled(session)
        if not messages:  # the first turn also renders the system prompt: nothing is known before it
            return
        try:
            deltas = [self.renderer.delta(text, messages, [{"role": "user", "content": f"{user_words} {probe}"
                                                            if user_words else probe}])[1] for probe in ("a", "b")]
        except Exception:  # a template that will not render this history: the next turn will say why
            log.debug("no opener for session %d", session.id, exc_info=True)
            return
        known = os.path.commonprefix(deltas)
        if user_words:  # the space before the probe belongs to the word the caller has not said yet
            known = known.removesuffix(" ")
        ids = self.renderer.encode(known)
        start = session.reply_end
        kept = len(os.path.commonprefix([session.ids[start:], ids]))
        if kept < len(session.ids) - start:
            session.truncate_kv(self.blocks, start + kept)
        if start + len(ids) >= self.context_budget:
            ids = ids[:kept]
        if len(ids) > kept:
            session.ids.extend(ids[kept:])
        session.warm_start = start if ids else None
        self.scheduler.session_idle(session)
        self._lock.notify_all()

    def _claim_opener(self, session: Session, delta_ids: list[int]) -> int:
        """Where the new turn's ids start: at the warmed ids, of which it keeps (with their K/V) the longest prefix
        that its own ids start with."""
        start = session.warm_start
        if start is None:
            return len(session.ids)
        kept = len(os.path.commonprefix([session.ids[start:], delta_ids]))
        if kept < len(session.ids) - start:
            self.counters["warm_ids_cut"] += len(session.ids) - start - kept
            session.truncate_kv(self.blocks, start + kept)
            self.counters["openers_missed"] += 1
        else:
            self.counters["openers_kept"] += 1
        session.warm_start = None
        return start

    def _append_turn(self, session: Session, new: list[dict[str, str]], max_tokens: int, stats: RequestStats) -> None:
        full, delta = self.renderer.delta(session.text, session.messages, new)
        delta_ids = self.renderer.encode(delta)
        start = self._claim_opener(session, delta_ids)
        if start + len(delta_ids) + max_tokens > self.context_budget:
            self._compact(session, new, max_tokens, stats)
            return
        session.marks.append(TurnMark(len(session.messages), start, len(session.text)))
        session.ids[start:] = delta_ids
        session.messages.extend(new)
        session.text = full

    def _compact(self, session: Session, new: list[dict[str, str]], max_tokens: int, stats: RequestStats) -> None:
        history = session.messages
        if not self.settings.compaction:
            raise ContextOverflowError(
                f"the prompt plus max_tokens={max_tokens} exceeds the context budget of {self.context_budget} "
                "tokens and compaction is off.", "shorten the conversation, lower max_tokens, or turn compaction on.")
        head = history[:1] if history and history[0]["role"] == "system" else []
        if new and new[0]["role"] == "system":
            head = []
        rest = history[len(head):]
        target = int(self.context_budget * self.settings.compaction_target)
        while True:
            kept = head + rest + new
            ids = self.renderer.encode(self.renderer.render(kept, add_generation_prompt=True))
            if len(ids) + max_tokens <= target or not rest:
                break
            rest = rest[1:]
            while rest and rest[0]["role"] != "user":  # restart on a user turn
                rest = rest[1:]
        if len(ids) + max_tokens > self.context_budget:
            raise ContextOverflowError(
                f"the prompt ({len(ids)} tokens) plus max_tokens={max_tokens} exceeds the context budget of "
                f"{self.context_budget} tokens even after compaction.", "send a shorter message or lower max_tokens.")
        session.drop_kv(self.blocks)
        self.scheduler.forget_session(session)
        session.ids = ids
        session.messages = kept
        session.text = self.renderer.render(kept, add_generation_prompt=True)
        session.marks = []
        session.compactions += 1
        stats.compacted = True
        self.counters["compactions"] += 1
        log.info("compacted session %d to %d tokens (%d messages)", session.id, len(ids), len(kept))
