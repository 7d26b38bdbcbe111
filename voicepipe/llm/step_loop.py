"""The engine thread (a mixin of `LLMEngine`): plan a step, run the model, sample, hand tokens to their
`Generation`s, finish requests; cancel, pause and stop-string cuts from the caller's side; the engine's stats."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from voicepipe.llm import blockq
from voicepipe.llm.attention import StepAborted
from voicepipe.llm.core_sharing import CoreSharing
from voicepipe.llm.errors import EngineStoppedError, LLMError, OverloadedError
from voicepipe.llm.generation import _Event
from voicepipe.llm.request import Request, State
from voicepipe.llm.sampling import sample, token_logprobs
from voicepipe.llm.speculative import accept

log = logging.getLogger("voicepipe.llm.engine")  # the engine's log lines keep its logger name


class StepLoop:
    """LLMEngine's step loop (a mixin).

    Runs on the engine thread, under `_lock` except for the proposals and the model forward: reads `_running`,
    `settings`, `end_ids`, `max_context`, `proposer` and `_request_listeners`; reads and writes `scheduler`,
    `runner`, `blocks`, the sessions of the requests it steps, `_step_abortable`, `counters`, `step_times` and
    `crashed`. Uses `_warm_next_turn` and `_restore_mark` (`intake.py`)."""

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
        sharing = CoreSharing(blockq.stalls, blockq.set_threads, torch.get_num_threads())
        try:
            while True:
                t_start = time.perf_counter()
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
                    t_planned = time.perf_counter()
                    picks, end_probs, logprobs, marks = self._run_step(plan.items)
                except StepAborted:  # a voice request arrived during a flex-only step: plan again, it goes first
                    with self._lock:
                        self._step_abortable = False
                        self.scheduler.step_aborted()
                    continue
                except Exception as exc:  # a failed step fails its requests; the engine carries on
                    log.exception("LLM step failed")
                    self._isolate_failure(plan.items, exc)
                    continue
                with self._lock:
                    self._step_abortable = False
                    self._after_step(plan.items, picks, end_probs, logprobs)
                    self._time_step(plan, (t_start, t_planned, *marks))
                sharing.after_step()
        except BaseException as exc:  # pragma: no cover - a bug: fail everyone loudly rather than hang
            log.exception("LLM engine thread crashed")
            self.crashed = exc
            with self._lock:
                self._running = False
                for req in list(self.scheduler.waiting) + list(self.scheduler.running):
                    self._finish(req, "error", EngineStoppedError(f"the LLM engine crashed: {exc}"))

    def _run_step(self, items) -> tuple[list, list[float], list | None, tuple[float, ...]]:
        """Drafts for the speculating items, the model forward over `items`, then the picks: each sampling item's
        tokens and accepted drafts (`_pick`), the end probes' values, the sampled tokens' logprobs (None when no
        request asked for them) and the phases' times (proposed, forwarded, mirrored, sampled)."""
        if self.proposer is not None:
            self.proposer.propose(items)
        proposed = time.perf_counter()
        logits = self.runner.forward(items)
        forwarded = time.perf_counter()
        if self.proposer is not None:
            self.proposer.mirror(items)
        mirrored = time.perf_counter()
        picks, n_rows, logprobs = self._pick(logits, [it for it in items if it.samples])
        end_probs = self._end_probs(logits[n_rows:]) if logits is not None else []
        return picks, end_probs, logprobs, (proposed, forwarded, mirrored, time.perf_counter())

    def _isolate_failure(self, items, exc: Exception) -> None:
        """A failed step of several requests runs again one request at a time (the items are independent, and
        nothing of the failed step was committed), so a fault that belongs to one request (its prompt, its
        constraint) fails that request alone and the others' calls go on; each request that fails alone ends
        with the error."""
        with self._lock:
            self._step_abortable = False  # no abort while the items run alone
            self.runner.cache.abort_requested = False
        requests = [item for item in items if item.request is not None]
        if len(requests) <= 1:
            self._fail_items(requests, exc)
            return
        for item in requests:
            try:
                picks, end_probs, logprobs, _ = self._run_step([item])
            except Exception as alone:
                log.error("LLM step failed for request %s alone: %s", item.request.id, alone)
                self._fail_items([item], alone)
                continue
            with self._lock:
                if item.request.state is not State.FINISHED:
                    self._after_step([item], picks, end_probs, logprobs)

    def _fail_items(self, items, exc: Exception) -> None:
        with self._lock:
            for item in items:
                if item.request.state is not State.FINISHED:
                    item.session.drop_kv(self.blocks)
                    self._finish(item.request, "error", LLMError(f"the model step failed: {exc}"))

    def _time_step(self, plan, marks: tuple[float, ...]) -> None:
        """Add the step's phases to ``step_times`` (seconds; see ``step_profile``)."""
        start, planned, proposed, forwarded, mirrored, sampled = marks
        times = self.step_times
        inputs = self.runner.last_inputs_s
        times["steps"] += 1
        times["decode_rows"] += sum(1 for item in plan.items if item.samples)
        times["schedule"] += planned - start
        times["propose"] += (proposed - planned) + (mirrored - forwarded)
        times["inputs"] += inputs
        times["forward"] += forwarded - proposed - inputs
        times["sample"] += sampled - mirrored
        times["bookkeeping"] += time.perf_counter() - sampled

    def step_profile(self) -> dict[str, float]:
        """Where the engine's steps spent their time so far: seconds per phase, summed over ``steps`` steps.
        ``schedule``: reaping and planning under the lock; ``propose``: drafting (and a draft model's mirror
        forward); ``inputs``: building the step's input tensors and layout (the host-to-device copies off the CPU);
        ``forward``: the model; ``sample``: picking tokens (the device-to-host copy of the picks off the CPU: on a
        GPU the forward's kernels finish there); ``bookkeeping``: committing K/V, appending tokens, events."""
        with self._lock:
            return dict(self.step_times)

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

    @staticmethod
    def _pick(logits, sampled) -> tuple[list[tuple[list[int], int]], int, list | None]:
        """Each sampling item's tokens to emit and how many of its drafted tokens were accepted (speculative.py),
        the logit rows they used, and the picked tokens' logprobs for the requests that asked
        (`SamplingParams.logprobs`; None when none did). One argmax over every row and one copy to the host serve
        the greedy rows and the drafts; only sampled or constrained requests go through ``sample`` row by row."""
        n_rows = sum(1 + len(item.draft) for item in sampled)
        if not n_rows:
            return [], 0, None
        best = logits[:n_rows].argmax(dim=-1).tolist()
        picks: list = []
        firsts: list[int] = []  # each item's first row
        row = 0
        for item in sampled:
            params = item.request.params
            if item.draft:
                picks.append(accept(item.draft, best[row:row + 1 + len(item.draft)]))
            elif params.greedy and params.constraint is None:
                picks.append(([best[row]], 0))
            else:
                picks.append((sample(logits[row:row + 1], [params], [item.request.generator]), 0))
            firsts.append(row)
            row += 1 + len(item.draft)
        params = [item.request.params for item in sampled]
        if all(p.logprobs is None for p in params):
            return picks, n_rows, None
        # a request asking for logprobs drafts nothing (`Request.speculate`): its pick's first token is its row's
        return picks, n_rows, token_logprobs(logits[firsts], [tokens[0] for tokens, _ in picks], params)

    def _after_step(self, items, picks: list[tuple[list[int], int]], end_probs: list[float],
                    logprobs: list | None = None) -> None:
        self.counters["steps"] += 1
        now = time.monotonic()
        picked = iter(picks)
        picked_logprobs = iter(logprobs or [])
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
            pick = next(picked) if item.samples else None
            token_logprob = next(picked_logprobs, None) if item.samples else None
            if req.state is State.FINISHED:  # cancelled while the step ran (close_session): already settled
                continue
            own = item.n_tokens - len(item.draft)
            if pick is None:
                s.commit(self.blocks, own)
                continue
            tokens, accepted = pick
            kept = self._kept(req, tokens)
            forced = self._forced_after(req, kept[-1])  # a constrained request drafts nothing: kept is one token
            s.ids.extend(kept)
            s.commit(self.blocks, own + len(kept) - 1)  # with the accepted drafts kept; the last token is pending
            s.ids.extend(forced)
            produced = kept + forced
            req.output_ids.extend(produced)
            st = req.stats
            st.output_tokens += len(produced)
            st.token_times.extend([now] * len(produced))
            if st.first_token is None:
                st.first_token = now
            if item.draft:
                st.draft_tokens += len(item.draft)
                st.accepted_tokens += accepted
                self.counters["draft_tokens"] += len(item.draft)
                self.counters["accepted_tokens"] += accepted
            # forced tokens are certain
            sampled_logprobs = None if logprobs is None else [token_logprob, *[(0.0, [])] * (len(produced) - 1)]
            self._emit(req, _Event("tokens", produced, now, logprobs=sampled_logprobs))
            if produced[-1] in req.stop_ids:
                self._finish(req, "stop")
            elif len(req.output_ids) >= req.params.max_tokens or len(s.ids) >= self.max_context:
                self._finish(req, "length")

    def _room(self, req: Request) -> int:
        """How many more tokens the request may append: its max_tokens, the context."""
        return min(req.params.max_tokens - len(req.output_ids), self.max_context - len(req.session.ids))

    def _kept(self, req: Request, tokens: list[int]) -> list[int]:
        """``tokens`` up to the first that ends the request (a stop token, max_tokens, the context)."""
        tokens = tokens[:self._room(req)]
        for i, token in enumerate(tokens):
            if token in req.stop_ids:
                return tokens[:i + 1]
        return tokens

    def _forced_after(self, req: Request, token: int) -> list[int]:
        """What a constrained request's grammar forces after `token`, within its budget and up to a stop token:
        appended at once and computed by the next step as one chunk, rather than one decode step per token."""
        constraint = req.params.constraint
        if constraint is None or token in req.stop_ids or not hasattr(constraint, "forced"):
            return []
        forced = []
        for t in constraint.forced()[:max(0, self._room(req) - 1)]:  # `token` is not appended yet
            constraint.accept(t)
            forced.append(t)
            if t in req.stop_ids:
                break
        return forced

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
                "spec_acceptance_rate": (self.counters["accepted_tokens"] / self.counters["draft_tokens"]
                                         if self.counters["draft_tokens"] else 0.0),
                "weights": self.weights.format,
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

