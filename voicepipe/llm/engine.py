"""The LLM engine: sessions on a paged, prefix-cached KV store, continuous batching in one thread, asyncio API.

Usage::

    engine = LLMEngine(model, tokenizer, settings.llm)
    engine.start()
    session = engine.open_session()
    async for piece in engine.generate(session, [{"role": "user", "content": "Hi"}], tier="priority"):
        print(piece.text, piece.token_ids, piece.time)
    engine.rollback_reply(session, heard_tokens)   # barge-in: keep what the caller heard
    engine.close_session(session)
    engine.stop()

Threading: the engine thread owns the model. Every change to sessions, the scheduler and the block manager
happens under ``self._lock``; the model forward runs outside it, on sessions that are busy (which no API call
mutates) and on what a warming step copied of idle sessions (an API call that cuts one bumps its ``edits``, and
the step's work on it is then thrown away). Results reach asyncio through ``loop.call_soon_threadsafe``;
detokenization runs on the caller's side.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from voicepipe.config import LLMSettings
from voicepipe.llm.attention import PagedKVCache, StepAborted
from voicepipe.llm.blocks import BlockManager
from voicepipe.llm.chat import ChatRenderer, validate_messages
from voicepipe.llm.detok import IncrementalDetokenizer
from voicepipe.llm.errors import (
    ContextOverflowError,
    EmptyMessagesError,
    EngineStoppedError,
    InvalidRequestError,
    LLMError,
    OverloadedError,
    SessionBusyError,
    SessionClosedError,
)
from voicepipe.llm.prepack import prepack_linears
from voicepipe.llm.request import TIER_RANK, Request, RequestStats, State, tier_rank
from voicepipe.llm.runner import ModelRunner, ModelShape
from voicepipe.llm.sampling import SamplingParams, make_generator, sample
from voicepipe.llm.scheduler import Scheduler
from voicepipe.llm.session import Session, TurnMark

log = logging.getLogger(__name__)

END_PUNCTUATION = " \t\n.,;:!?…"  # stripped from a user message's end before the end probe


@dataclass
class Piece:
    """A piece of streamed reply text, the token ids it came from, and when they were produced (monotonic s)."""

    text: str
    token_ids: list[int]
    time: float


@dataclass
class _Event:
    kind: str  # "tokens", "done", "error"
    token_ids: list[int] = field(default_factory=list)
    time: float = 0.0
    error: BaseException | None = None


def _free_memory_bytes(device: str) -> int:
    if device.startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info()
        return free
    try:
        import psutil

        return psutil.virtual_memory().available
    except ImportError:  # pragma: no cover - psutil is usually present
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    return 1 << 30


class Generation:
    """One streamed reply. ``async for piece in generation`` yields ``Piece``s; after the loop, ``text``,
    ``token_ids``, ``finish_reason`` and ``stats`` hold the outcome. Leaving the loop early (break, an
    exception, task cancellation) cancels the request within one engine step."""

    def __init__(self, engine: LLMEngine, request: Request, queue: asyncio.Queue, stops: list[str]) -> None:
        self._engine = engine
        self.request = request
        self._queue = queue
        self._stops = stops
        self._hold = max((len(s) for s in stops), default=1) - 1
        self.text = ""
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        # With ``end_probe``: resolves to ``stats.end_prob`` once the prompt's probe row is computed (None if the
        # request ends first, or asked for no probe)
        self.end_prob: asyncio.Future = request.end_prob_future
        self._started = False

    @property
    def stats(self) -> RequestStats:
        return self.request.stats

    @property
    def session(self) -> Session:
        return self.request.session

    def cancel(self) -> None:
        self._engine._cancel(self.request)

    def pause(self, max_s: float) -> None:
        """Decode no more tokens of this reply until ``resume()``, or for ``max_s`` at most. A call pauses its reply
        while the TTS makes the first audio: on a CPU the two compete for the same cores, and the caller waits for
        that audio, not for the tokens after it."""
        self._engine._pause(self.request, time.monotonic() + max_s)

    def resume(self) -> None:
        self._engine._pause(self.request, 0.0)

    def __aiter__(self) -> AsyncIterator[Piece]:
        if self._started:
            raise RuntimeError("a Generation can be iterated once")
        self._started = True
        return self._stream()

    async def _stream(self) -> AsyncIterator[Piece]:
        detok = IncrementalDetokenizer(self._engine.tokenizer)
        emitted = 0  # chars of detok.text already yielded
        pending_ids: list[int] = []
        stop_ids = self.request.stop_ids
        try:
            while True:
                ev: _Event = await self._queue.get()
                if ev.kind == "error":
                    self.finish_reason = "error"
                    raise ev.error
                if ev.kind == "tokens":
                    self.token_ids.extend(ev.token_ids)
                    pending_ids.extend(ev.token_ids)
                    visible = [t for t in ev.token_ids if t not in stop_ids or self.request.params.ignore_eos]
                    detok.push(visible)
                    full = detok.text
                    cut = self._find_stop(full, emitted)
                    if cut is not None:
                        self._engine._stop_at(self.request, len(self.token_ids))
                        piece = full[emitted:cut]
                        self.text = full[:cut]
                        if piece:
                            yield Piece(piece, pending_ids, ev.time)
                        self.finish_reason = "stop"
                        await self._drain()
                        return
                    upto = max(emitted, len(full) - self._hold)
                    if upto > emitted:
                        yield Piece(full[emitted:upto], pending_ids, ev.time)
                        pending_ids = []
                        emitted = upto
                    continue
                # done
                detok.flush()
                full = detok.text
                self.text = full
                self.finish_reason = self.request.finish_reason
                if len(full) > emitted or pending_ids:
                    yield Piece(full[emitted:], pending_ids, time.monotonic())
                return
        finally:
            if self.finish_reason is None:
                self.cancel()

    def _find_stop(self, text: str, emitted: int) -> int | None:
        if not self._stops:
            return None
        start = max(0, emitted - self._hold)
        hits = [i for i in (text.find(s, start) for s in self._stops) if i >= 0]
        return min(hits) if hits else None

    async def _drain(self) -> None:
        while True:
            ev = await self._queue.get()
            if ev.kind != "tokens":
                return


class LLMEngine:
    def __init__(self, model, tokenizer, settings: LLMSettings | None = None) -> None:
        self.settings = settings or LLMSettings()
        self.tokenizer = tokenizer
        self.renderer = ChatRenderer(tokenizer)
        s = self.settings
        if s.prepack_linears:
            prepack_linears(model)
        device = str(next(model.parameters()).device)
        shape = ModelShape.of(model)
        dtype = next(model.parameters()).dtype
        per_token = PagedKVCache.bytes_per_token(shape.num_layers, shape.num_kv_heads, shape.head_dim, dtype)
        pool_bytes = (s.kv_cache_mib * 2**20 if s.kv_cache_mib is not None
                      else int(_free_memory_bytes(device) * s.kv_cache_memory_fraction))
        num_blocks = max(2, pool_bytes // (per_token * s.block_size))
        self.blocks = BlockManager(num_blocks, s.block_size)
        self.runner = ModelRunner(model, num_blocks, s.block_size)
        self.scheduler = Scheduler(self.blocks, s.max_tokens_per_step, s.max_running, s.flex_aging_steps,
                                   warm_idle=s.warm_next_turn)
        self.capacity_tokens = num_blocks * s.block_size
        self.max_context = min(shape.max_context, self.capacity_tokens)
        self.context_budget = min(s.context_tokens or shape.max_context, self.max_context)
        self.model_stop_ids = self._model_stop_ids(model, tokenizer)
        self.end_ids = self._end_of_message_ids()
        log.info("LLM KV pool: %d blocks of %d tokens = %d tokens (%.0f MiB, %d bytes/token); context budget %d",
                 num_blocks, s.block_size, self.capacity_tokens, num_blocks * s.block_size * per_token / 2**20,
                 per_token, self.context_budget)
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None
        self._running = False
        self._sessions: dict[int, Session] = {}
        self._step_abortable = False  # the running step is flex work only (see Scheduler.step_aborted)
        self.counters = {"requests": 0, "finished": 0, "cancelled": 0, "errors": 0, "overloaded": 0,
                         "compactions": 0, "prompt_tokens": 0, "cached_prompt_tokens": 0, "output_tokens": 0,
                         "steps": 0, "max_batch": 0, "warmed_tokens": 0, "openers_kept": 0, "openers_missed": 0,
                         "warm_ids_cut": 0}
        self.crashed: BaseException | None = None
        self._request_listeners: list[Callable[[Request], None]] = []

    @staticmethod
    def _model_stop_ids(model, tokenizer) -> frozenset[int]:
        ids: set[int] = set()
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        for value in (eos, tokenizer.eos_token_id):
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(v for v in value if isinstance(v, int))
        return frozenset(ids)

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

    # -- lifecycle ------------------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="llm-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._running = False
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        with self._lock:
            for req in list(self.scheduler.waiting) + list(self.scheduler.running):
                self._finish(req, "cancelled", EngineStoppedError("the LLM engine stopped.", "restart the service."))

    close = stop

    def add_request_listener(self, listener: Callable[[Request], None]) -> None:
        """Call ``listener(request)`` once for every request as it ends (finished, cancelled or failed), with its
        ``tier``, ``finish_reason``, ``stats`` and ``session`` (``session.requests`` is its turn number; a turn
        dropped later gives its number back). It runs on the engine thread under the engine's lock: it must be
        quick and must not call the engine. An exception in it is logged and ignored."""
        self._request_listeners.append(listener)

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
                 params: SamplingParams | None = None, end_probe: bool = False, **sampling: Any) -> Generation:
        """Start a reply to ``new_messages`` appended to ``session`` (None: a sessionless request whose messages
        are the whole conversation). Call it from the event loop; iterate the result with ``async for``.

        ``end_probe``: also compute, in the same prefill, P(the last user message ends where its words end): the
        probability of an end token (``end_ids``) after its content less trailing punctuation. It resolves
        ``Generation.end_prob`` (and ``stats.end_prob``) with the prefill step that reaches those words."""
        params = self._params(params, sampling)
        tier_rank(tier)
        new = validate_messages(new_messages)

        def prepare(session: Session, stats: RequestStats) -> int | None:
            self._settle_reply(session)
            msgs = new
            system = session.system_prompt
            if system is not None and not session.messages and msgs[0]["role"] != "system":
                msgs = [{"role": "system", "content": system}] + msgs
            self._append_turn(session, msgs, params.max_tokens, stats)
            return self._probe_index(session, msgs) if end_probe else None

        return self._submit(session, prepare, tier, params)

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

    def _submit(self, session: Session | None, prepare, tier: str, params: SamplingParams) -> Generation:
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
                          sink=(loop, queue), probe_at=probe_at, end_prob_future=loop.create_future())
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
        return Generation(self, req, queue, list(params.stop))

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

    def _cancel(self, req: Request) -> None:
        with self._lock:
            req.cancelled = True
            self._lock.notify_all()

    def _pause(self, req: Request, until: float) -> None:
        with self._lock:
            req.paused_until = until
            self._lock.notify_all()

    def _stop_at(self, req: Request, n_output: int) -> None:
        """A stop string ended the reply after ``n_output`` tokens: keep those, drop any later ones."""
        with self._lock:
            if req.state is State.FINISHED:  # it ended in the same step: cut the finished reply directly
                s = req.session
                if (not s.busy and not s.closed and s.reply_start == req.stats.prompt_tokens
                        and len(req.output_ids) > n_output):
                    s.truncate_kv(self.blocks, s.reply_start + n_output)
                    del req.output_ids[n_output:]
                    self._warm_next_turn(s)
                return
            req.keep_output = n_output
            req.cancelled = True
            self._lock.notify_all()

    # -- the engine thread ------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        import torch

        torch.set_grad_enabled(False)
        try:
            while True:
                with self._lock:
                    if not self._running:
                        return
                    self._reap()
                    plan = self.scheduler.schedule(time.monotonic()) if self.scheduler.has_work else None
                    if plan is None or not plan.items:
                        self._lock.wait(timeout=0.05)
                        continue
                    for s in plan.unpinned:
                        log.debug("unpinned idle session %d", s.id)
                    self._step_abortable = plan.abortable
                    self.runner.cache.abort_requested = False
                    now = time.monotonic()
                    self.counters["max_batch"] = max(self.counters["max_batch"], len(plan.items))
                    for item in plan.items:
                        if item.request is None:
                            continue
                        st = item.request.stats
                        if st.first_scheduled is None:
                            st.first_scheduled = now
                            st.cached_prompt_tokens = item.start
                            self.counters["prompt_tokens"] += st.prompt_tokens
                            self.counters["cached_prompt_tokens"] += item.start
                try:
                    logits = self.runner.forward(plan.items)
                    sampled = [it for it in plan.items if it.samples]
                    tokens = sample(logits[:len(sampled)], [it.request.params for it in sampled],
                                    [it.request.generator for it in sampled]) if sampled else []
                    end_probs = self._end_probs(logits[len(sampled):]) if logits is not None else []
                except StepAborted:  # a voice request arrived during a flex-only step: plan again, it goes first
                    with self._lock:
                        self._step_abortable = False
                        self.scheduler.step_aborted()
                    continue
                except Exception as exc:  # a failed step fails its requests; the engine carries on
                    log.exception("LLM step failed")
                    with self._lock:
                        for item in plan.items:
                            if item.request is not None:
                                item.session.drop_kv(self.blocks)
                                self._finish(item.request, "error", LLMError(f"the model step failed: {exc}"))
                    continue
                with self._lock:
                    self._step_abortable = False
                    self._after_step(plan.items, tokens, end_probs)
        except BaseException as exc:  # pragma: no cover - a bug: fail everyone loudly rather than hang
            log.exception("LLM engine thread crashed")
            self.crashed = exc
            with self._lock:
                self._running = False
                for req in list(self.scheduler.waiting) + list(self.scheduler.running):
                    self._finish(req, "error", EngineStoppedError(f"the LLM engine crashed: {exc}"))

    def _reap(self) -> None:
        """Cancelled and expired requests leave before the next step is planned."""
        now = time.monotonic()
        for req in list(self.scheduler.waiting) + list(self.scheduler.running):
            if req.cancelled:
                self._finish(req, "stop" if req.keep_output is not None else "cancelled")
        for req in self.scheduler.expired(now, self.settings.admission_timeout_s):
            self.counters["overloaded"] += 1
            self._finish(req, "error", OverloadedError(
                f"the LLM engine could not admit the request within {self.settings.admission_timeout_s:g} s.",
                "retry later, or raise llm.admission_timeout_s / the KV pool size."))

    def _end_probs(self, probe_logits) -> list[float]:
        if not len(probe_logits):
            return []
        import torch

        return torch.softmax(probe_logits, dim=-1)[:, self.end_ids].sum(dim=-1).tolist()

    def _after_step(self, items, tokens: list[int], end_probs: list[float]) -> None:
        self.counters["steps"] += 1
        now = time.monotonic()
        k = 0
        probes = iter(end_probs)
        for item in items:
            req, s = item.request, item.session
            if item.probe is not None:
                value = next(probes)
                if req.state is not State.FINISHED and req.probe_at is not None:
                    req.probe_at = None
                    req.stats.end_prob = value
                    self._resolve_end_prob(req, value)
            if req is None:  # warming: unless the session was cut or closed while the step ran
                if s.edits == item.edits and not s.closed:
                    s.commit(self.blocks, item.n_tokens)
                    self.counters["warmed_tokens"] += item.n_tokens
                continue
            if req.state is State.FINISHED:  # cancelled while the step ran (close_session): already settled
                continue
            s.commit(self.blocks, item.n_tokens)
            if not item.samples:
                continue
            token = tokens[k]
            k += 1
            s.ids.append(token)
            req.output_ids.append(token)
            st = req.stats
            st.output_tokens += 1
            st.token_times.append(now)
            if st.first_token is None:
                st.first_token = now
            self._emit(req, _Event("tokens", [token], now))
            if token in req.stop_ids:
                self._finish(req, "stop")
            elif len(req.output_ids) >= req.params.max_tokens or len(s.ids) >= self.max_context:
                self._finish(req, "length")

    def _finish(self, req: Request, reason: str, error: BaseException | None = None) -> None:
        self.scheduler.remove(req)
        req.finish_reason = reason
        req.stats.finished = time.monotonic()
        s = req.session
        if req.keep_output is not None and req.keep_output < len(req.output_ids):
            s.truncate_kv(self.blocks, s.reply_start + req.keep_output)
            del req.output_ids[req.keep_output:]
        s.busy = False
        s.last_used = time.monotonic()
        if error is not None and not req.output_ids and s.marks and not s.closed:
            self._restore_mark(s, s.marks[-1])  # the failed turn leaves no trace in the history
        if s.closed or s.ephemeral:
            s.drop_kv(self.blocks)
            self.scheduler.forget_session(s)
        else:
            self.scheduler.session_idle(s)
            if error is None and reason != "cancelled":
                self._warm_next_turn(s)
        self._resolve_end_prob(req, req.stats.end_prob)
        key = {"cancelled": "cancelled", "error": "errors"}.get(reason, "finished")
        self.counters[key] += 1
        self.counters["output_tokens"] += req.stats.output_tokens
        for listener in self._request_listeners:  # before the "done" event, so a client that saw it sees these
            try:
                listener(req)
            except Exception:
                log.exception("request listener %r failed", listener)
        self._emit(req, _Event("error", error=error) if error is not None else _Event("done", time=time.monotonic()))

    @staticmethod
    def _resolve_end_prob(req: Request, value: float | None) -> None:
        future = req.end_prob_future
        if future is None or future.done():
            return
        with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody is listening
            req.sink[0].call_soon_threadsafe(lambda: future.done() or future.set_result(value))

    @staticmethod
    def _emit(req: Request, event: _Event) -> None:
        loop, queue = req.sink
        try:
            loop.call_soon_threadsafe(queue.put_nowait, event)
        except RuntimeError:  # the caller's loop is closed: nobody is listening
            req.cancelled = True

    # -- stats ----------------------------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        with self._lock:
            bm = self.blocks
            prompt = self.counters["prompt_tokens"]
            return {
                **self.counters,
                "blocks_total": bm.num_blocks,
                "blocks_used": bm.num_used,
                "blocks_free": bm.num_free,
                "block_size": bm.block_size,
                "capacity_tokens": self.capacity_tokens,
                "kv_bytes_per_token": self.runner.bytes_per_token,
                "prefix_hit_rate": (self.counters["cached_prompt_tokens"] / prompt) if prompt else 0.0,
                "block_hit_rate": (bm.hit_blocks / bm.lookup_blocks) if bm.lookup_blocks else 0.0,
                "preemptions": self.scheduler.preemptions,
                "aborted_steps": self.scheduler.aborted_steps,
                "preemptions_by_tier": dict(self.scheduler.preemptions_by_tier),
                "unpinned_sessions": self.scheduler.unpins,
                "waiting": len(self.scheduler.waiting),
                "running": len(self.scheduler.running),
                "sessions": len(self._sessions),
                "sessions_pinned": sum(1 for s in self._sessions.values() if s.block_table),
            }
