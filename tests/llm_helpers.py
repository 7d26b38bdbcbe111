"""LLM engines for tests, on a model loaded once per session (`engine_model` in tests/e2e/conftest.py)."""

from __future__ import annotations

from voicepipe.config import LLMSettings
from voicepipe.llm.engine import LLMEngine


def start_engine(engine_model, draft_model=None, **settings) -> LLMEngine:
    """A started engine over `(model, tokenizer)` with `LLMSettings(**settings)` (a 64 MiB KV pool unless given)."""
    model, tokenizer = engine_model
    engine = LLMEngine(model, tokenizer, LLMSettings(**{"kv_cache_mib": 64, **settings}), draft_model=draft_model)
    engine.start()
    return engine
