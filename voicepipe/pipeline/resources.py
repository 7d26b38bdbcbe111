"""The shared models a call needs, taken from the process `Runtime`.

Every call shares one VAD model, one STT worker, one TTS worker and one LLM engine. Where the runtime
already holds the shared object (`runtime.engine`, a `Transcriber`, a `Synthesizer`, a `SileroVAD`) it is
used as is; otherwise it is built once from the runtime's loaded models and kept on the runtime.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

_lock = threading.Lock()


@dataclass(frozen=True)
class CallResources:
    engine: Any  # voicepipe.llm.engine.LLMEngine (started)
    vad: Any  # voicepipe.vad.SileroVAD
    transcriber: Any  # voicepipe.stt.Transcriber
    synthesizer: Any  # voicepipe.tts.Synthesizer (with word alignments)
    turn: Any = None  # voicepipe.turns.acoustic.SmartTurn or None (the end-of-turn policy goes without it)


def call_resources(runtime) -> CallResources:
    """The shared call resources (blocking the first time: call it from a worker thread)."""
    cached = getattr(runtime, "call_resources", None)
    if isinstance(cached, CallResources):
        return cached
    with _lock:
        cached = getattr(runtime, "call_resources", None)
        if isinstance(cached, CallResources):
            return cached
        if not runtime.ready:
            raise RuntimeError("the models are still loading")
        if runtime.load_error:
            raise RuntimeError(f"the models failed to load: {runtime.load_error}")
        res = CallResources(_engine(runtime), _vad(runtime), _transcriber(runtime), _synthesizer(runtime),
                            getattr(runtime, "turn", None))
        _prepare_tools(res.engine, runtime.settings.calls)
        runtime.call_resources = res
        return res


def _prepare_tools(engine, cfg) -> None:
    """Calls with tools constrain their replies: build the grammar's view of the tokenizer (about a second of CPU)
    here, off the event loop, rather than in the first call's reply."""
    grammar = getattr(engine, "grammar_tokenizer", None)
    if (cfg.tools or cfg.webhook_tools) and grammar is not None:
        grammar.get()


def _engine(runtime):
    deadline = time.monotonic() + 60
    while getattr(runtime, "engine", None) is None and hasattr(runtime, "engine") and time.monotonic() < deadline:
        time.sleep(0.05)  # the runtime starts its engine right after loading the LLM
    engine = getattr(runtime, "engine", None)
    if engine is not None:
        return engine
    from voicepipe.llm.engine import LLMEngine

    engine = LLMEngine(runtime.llm, runtime.tokenizer, runtime.settings.llm)
    engine.start()
    runtime.engine = engine
    log.info("calls: started the LLM engine")
    return engine


def _vad(runtime):
    from voicepipe.vad import SileroVAD

    for name in ("silero", "vad"):
        value = getattr(runtime, name, None)
        if isinstance(value, SileroVAD):
            return value
    return SileroVAD(runtime.vad)


def _transcriber(runtime):
    from voicepipe.stt import Transcriber

    for name in ("transcriber", "stt"):
        value = getattr(runtime, name, None)
        if isinstance(value, Transcriber):
            return value
    transcriber = Transcriber(runtime.stt, runtime.settings.stt)
    runtime.transcriber = transcriber
    return transcriber


def _synthesizer(runtime):
    from voicepipe.tts import Synthesizer

    for name in ("synthesizer", "tts"):
        value = getattr(runtime, name, None)
        if isinstance(value, Synthesizer):
            return value
    path = runtime.model_paths()["tts"]
    from voicepipe.devices import resolve_device

    synthesizer = Synthesizer.load(path, runtime.settings.tts, resolve_device(runtime.settings.device) == "cuda")
    runtime.synthesizer = synthesizer
    return synthesizer


def warm_up_in_background(runtime, poll_s: float = 0.2) -> threading.Thread:
    """Build the call resources as soon as the models are loaded, so the first call does not wait for them."""

    def run() -> None:
        deadline = time.monotonic() + 1800
        while not runtime.ready:
            if runtime.load_error or time.monotonic() > deadline:
                return
            time.sleep(poll_s)
        try:
            call_resources(runtime)
        except Exception:
            log.exception("calls: preparing the shared call resources failed")

    thread = threading.Thread(target=run, name="calls-warm-up", daemon=True)
    thread.start()
    return thread
