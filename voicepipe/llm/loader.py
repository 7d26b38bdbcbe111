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
