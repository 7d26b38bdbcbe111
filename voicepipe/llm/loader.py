"""Load a causal LM and its tokenizer through transformers' own classes (any Llama/Qwen/Mistral family)."""

from __future__ import annotations

from pathlib import Path

from voicepipe.errors import ModelError


def load_causal_lm(path: Path, device: str, dtype_name: str):
    """Return ``(model, tokenizer)`` in eval mode on ``device``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype_name))
    except (OSError, ValueError) as exc:
        raise ModelError(f"could not load the LLM from {path}: {exc}",
                         "point models.llm at a transformers checkpoint directory.") from None
    return model.to(device).eval(), tokenizer


def load_default_llm(settings):
    """The configured LLM on the configured device, as ``(model, tokenizer)``."""
    from voicepipe.devices import llm_dtype_name, resolve_device
    from voicepipe.models import resolve_model

    path = resolve_model(settings.models.llm, "llm", settings.paths.models_dir)
    return load_causal_lm(path, resolve_device(settings.device), llm_dtype_name(settings.device))
