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

This file holds `LLMEngine`'s construction (KV pool, runner, scheduler) and lifecycle. It inherits the request
intake and session API from `intake.py` (`RequestIntake`) and the engine thread's step loop and stats from
`step_loop.py` (`StepLoop`); `generation.py` holds the `Generation` and `Piece`s a caller gets back.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from voicepipe.config import LLMSettings
from voicepipe.errors import ModelError
from voicepipe.llm.attention import PagedKVCache
from voicepipe.llm.blocks import BlockManager
from voicepipe.llm.chat import ChatRenderer
from voicepipe.llm.constraints import GrammarTokenizer
from voicepipe.llm.errors import EngineStoppedError
from voicepipe.llm.intake import RequestIntake
from voicepipe.llm.prepack import prepack_linears
from voicepipe.llm.quality import choose_weights
from voicepipe.llm.request import Request
from voicepipe.llm.runner import ModelRunner, ModelShape
from voicepipe.llm.scheduler import Scheduler
from voicepipe.llm.session import Session
from voicepipe.llm.speculative import DraftModel, PromptLookup, Proposer
from voicepipe.llm.step_loop import StepLoop

log = logging.getLogger(__name__)


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


class LLMEngine(RequestIntake, StepLoop):
    """``draft_model``: the draft of ``llm.speculative = "draft"`` (same tokenizer; the runtime loads
    ``llm.draft_model``)."""

    def __init__(self, model, tokenizer, settings: LLMSettings | None = None, draft_model=None) -> None:
        self.settings = settings or LLMSettings()
        self.tokenizer = tokenizer
        self.renderer = ChatRenderer(tokenizer)
        self.grammar_tokenizer = GrammarTokenizer(tokenizer)  # built at its first use (JSON mode, tool calls)
        s = self.settings
        self.weights, decoder = choose_weights(model, tokenizer, s.weights, pack=s.prepack_linears,
                                                     fast_decoder=s.fast_decoder)
        log.info("LLM weights: %s (%s)", self.weights.format, self.weights.reason)
        if decoder is None and s.prepack_linears:
            prepack_linears(model)
        device = str(next(model.parameters()).device)
        shape = ModelShape.of(model)
        dtype = self.weights.dtype
        per_token = PagedKVCache.bytes_per_token(shape.num_layers, shape.num_kv_heads, shape.head_dim, dtype)
        draft = self._draft_parts(draft_model, tokenizer, model)
        if draft is not None:  # the draft's pool has the target pool's blocks
            per_token += PagedKVCache.bytes_per_token(draft[1].num_layers, draft[1].num_kv_heads, draft[1].head_dim,
                                                      draft[0].dtype if draft[0] is not None else dtype)
        pool_bytes = (s.kv_cache_mib * 2**20 if s.kv_cache_mib is not None
                      else int(_free_memory_bytes(device) * s.kv_cache_memory_fraction))
        num_blocks = max(2, pool_bytes // (per_token * s.block_size))
        self.blocks = BlockManager(num_blocks, s.block_size)
        self.runner = ModelRunner(model, num_blocks, s.block_size, decoder, cuda_graphs=s.cuda_graphs)
        self.proposer: Proposer | None = None
        if s.speculative == "ngram":
            self.proposer = PromptLookup(max_n=s.spec_ngram, min_n=min(2, s.spec_ngram))
        elif draft is not None:
            self.proposer = DraftModel(ModelRunner(draft_model, num_blocks, s.block_size, draft[0]))
        self.scheduler = Scheduler(self.blocks, s.max_tokens_per_step, s.max_running, s.flex_aging_steps,
                                   warm_idle=s.warm_next_turn, spec_tokens=s.spec_tokens if self.proposer else 0,
                                   spec_max_batch=s.spec_max_batch)
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
                         "warm_ids_cut": 0, "draft_tokens": 0, "accepted_tokens": 0}
        self.step_times = dict.fromkeys(("steps", "decode_rows", "schedule", "propose", "inputs", "forward", "sample",
                                         "bookkeeping"), 0.0)
        self.crashed: BaseException | None = None
        self._request_listeners: list[Callable[[Request], None]] = []

    def _draft_parts(self, draft_model, tokenizer, model):
        """The draft model's decoder and shape under ``llm.speculative = "draft"`` (None otherwise)."""
        s = self.settings
        if s.speculative != "draft":
            return None
        if draft_model is None:
            raise ModelError("llm.speculative = draft needs a draft model.",
                             "set llm.draft_model (a model of the same vocabulary), or use ngram.")
        vocab = int(draft_model.get_output_embeddings().weight.shape[0])
        if vocab != int(model.get_output_embeddings().weight.shape[0]):
            raise ModelError(f"the draft model's vocabulary ({vocab} tokens) is not the model's.",
                             "pick a draft model of the same family and tokenizer.")
        choice, decoder = choose_weights(draft_model, tokenizer, s.weights, pack=s.prepack_linears,
                                         fast_decoder=s.fast_decoder)
        log.info("LLM draft model weights: %s (%s)", choice.format, choice.reason)
        if decoder is None and s.prepack_linears:
            prepack_linears(draft_model)
        return decoder, ModelShape.of(draft_model)

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
