"""The loaded models of one process: every call and every API request shares them."""

from __future__ import annotations

import ctypes
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from voicepipe.config import Settings
from voicepipe.devices import llm_dtype_name, resolve_device
from voicepipe.errors import ModelError
from voicepipe.models import load_manifest, resolve_model

log = logging.getLogger(__name__)

M_ARENA_MAX = -8  # mallopt's parameter number for the arena cap (glibc's malloc.h)


def limit_malloc_arenas(count: int) -> bool:
    """Cap glibc's malloc arenas at ``count`` for threads that get one from now on (``server.malloc_arenas``).
    False, and nothing changed, for 0 or where the C library is not glibc."""
    if count <= 0:
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return mallopt(M_ARENA_MAX, count) == 1


@dataclass
class Runtime:
    settings: Settings
    llm: Any = None
    tokenizer: Any = None
    stt: Any = None
    tts: Any = None
    vad: Any = None
    engine: Any = None  # voicepipe.llm.engine.LLMEngine over self.llm, started after loading
    silero: Any = None  # voicepipe.vad.SileroVAD over self.vad, shared by every call's VAD stream
    transcriber: Any = None  # voicepipe.stt.Transcriber: the one STT worker over self.stt
    synthesizer: Any = None  # voicepipe.tts.Synthesizer: the one TTS worker over self.tts
    turn: Any = None  # voicepipe.turns.acoustic.SmartTurn, or None when the end-of-turn policy goes without it
    load_seconds: dict[str, float] = field(default_factory=dict)
    load_error: str | None = None
    # called by the LLM engine as each request ends (LLMEngine.add_request_listener); add them before load()
    request_listeners: list[Callable[[Any], None]] = field(default_factory=list)
    _turn_warned: bool = field(default=False, repr=False)

    @property
    def ready(self) -> bool:
        return all(part is not None for part in (self.vad, self.transcriber, self.synthesizer, self.engine))

    def load(self) -> None:
        """Load all models (blocking: call it from a worker thread in the server)."""
        try:
            self._load_all()
        except Exception as exc:
            self.load_error = str(exc)
            raise

    def _load_all(self) -> None:
        from voicepipe.llm.loader import load_causal_lm
        from voicepipe.stt import Transcriber
        from voicepipe.stt.model import load_whisper, stt_placement
        from voicepipe.tts import Synthesizer
        from voicepipe.vad import SileroVAD
        from voicepipe.vad.model import load_silero

        if limit_malloc_arenas(self.settings.server.malloc_arenas):
            log.info("malloc arenas capped at %d", self.settings.server.malloc_arenas)
        device = resolve_device(self.settings.device)
        paths = self.model_paths()
        self.vad = self._timed("vad", load_silero, paths["vad"])
        if "turn" in paths:
            self.turn = self._load_turn(paths["turn"])
        self.stt = self._timed("stt", load_whisper, paths["stt"], *stt_placement(self.settings))
        self.synthesizer = self._timed("tts", Synthesizer.load, paths["tts"], self.settings.tts, device == "cuda")
        self.tts = self.synthesizer.voice
        self.silero = SileroVAD(self.vad)
        self.transcriber = Transcriber(self.stt, self.settings.stt)
        if self.settings.llm.backend == "openai":
            engine = self._timed("llm", self._remote_engine, paths.get("tokenizer"))
        else:
            self.llm, self.tokenizer = self._timed("llm", load_causal_lm, paths["llm"], device,
                                                   llm_dtype_name(self.settings.device))
            from voicepipe.llm.engine import LLMEngine

            draft = None
            llm = self.settings.llm
            if llm.speculative == "draft" and llm.draft_model is not None:  # without one, the engine says what to set
                draft_path = resolve_model(llm.draft_model, "llm", self.settings.paths.models_dir)
                draft, _ = self._timed("llm_draft", load_causal_lm, draft_path, device,
                                       llm_dtype_name(self.settings.device))
            engine = LLMEngine(self.llm, self.tokenizer, llm, draft_model=draft)
        for listener in self.request_listeners:
            engine.add_request_listener(listener)
        engine.start()
        self.engine = engine
        # The models' objects live as long as the process. Left to the collector, each full collection walked all
        # of them (400k objects, ~190 ms) holding the GIL, and every call's audio waited as long (the event loop ran
        # ~250 ms late once in each 10-turn `bench call`); frozen, it walks only what calls make.
        gc.freeze()

    def _remote_engine(self, tokenizer_path: Path | None):
        """`llm.backend = "openai"`: a client of the server at llm.base_url, no LLM here; with llm.tokenizer, its end
        probe renders the chat with that tokenizer's template."""
        from voicepipe.llm.remote import RemoteEngine
        from voicepipe.llm.remote.probe import EndProbe

        prober = None
        if tokenizer_path is not None:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
            prober = EndProbe(self.tokenizer)
        return RemoteEngine(self.settings.llm, prober)

    def close(self) -> None:
        """Stop the model threads (the LLM engine); pending generations end with an error."""
        if self.engine is not None:
            self.engine.stop()
        for worker in (self.transcriber, self.synthesizer):
            if worker is not None:
                worker.close()

    def model_paths(self) -> dict[str, Path]:
        """Resolve every configured model to files; cheap, so `serve` checks it before starting."""
        models, models_dir = self.settings.models, self.settings.paths.models_dir
        llm = self.settings.llm
        kinds = ("vad", "stt", "tts") if llm.backend == "openai" else ("vad", "stt", "tts", "llm")
        paths = {kind: resolve_model(getattr(models, kind), kind, models_dir) for kind in kinds}
        if llm.backend == "openai" and llm.tokenizer:  # the remote model's tokenizer, for the end probe
            paths["tokenizer"] = resolve_model(llm.tokenizer, "llm", models_dir)
        turn = self._turn_model_path()
        if turn is not None:
            paths["turn"] = turn
        return paths

    @property
    def wants_turn_model(self) -> bool:
        """Whether to load the acoustic model: turn.acoustic = "on" (calls may then pick `hybrid` or `acoustic` with
        their turn_policy parameter), or "auto" with a default policy that weighs the sound."""
        turn = self.settings.turn
        return turn.acoustic == "on" or (turn.acoustic == "auto" and turn.policy in ("acoustic", "hybrid"))

    def _turn_model_path(self) -> Path | None:
        """The acoustic model's files; turn.acoustic="on" refuses a missing model, "auto" warns and goes on."""
        if not self.wants_turn_model:
            return None
        spec = self.settings.models.turn
        try:
            return resolve_model(spec, "turn", self.settings.paths.models_dir)
        except ModelError as exc:
            fix = f"run `voicepipe models fetch {spec}`" if spec in load_manifest() else (exc.fix or "").rstrip(".")
            if self.settings.turn.acoustic == "on":
                raise ModelError(exc.message, f"{fix}, or set turn.acoustic=auto to start without it.") from None
            self._warn_no_turn_model(exc.message, fix)
            return None

    def _load_turn(self, path: Path):
        from voicepipe.turns.acoustic import SmartTurn

        try:
            return self._timed("turn", SmartTurn.load, path)
        except ModelError as exc:
            if self.settings.turn.acoustic == "on":
                raise
            self._warn_no_turn_model(exc.message, (exc.fix or "").rstrip("."))
            return None

    def _warn_no_turn_model(self, problem: str, fix: str) -> None:
        if self._turn_warned:  # model_paths() runs at serve's check and again at load: say it once
            return
        self._turn_warned = True
        log.warning("%s The %s end-of-turn policy goes on with the text evidence alone. Fix: %s "
                    "(or set turn.acoustic=off).", problem, self.settings.turn.policy, fix)

    def _timed(self, name: str, loader, *args):
        start = time.perf_counter()
        loaded = loader(*args)
        self.load_seconds[name] = round(time.perf_counter() - start, 3)
        log.info("loaded %s model in %.2f s", name, self.load_seconds[name])
        return loaded
