"""One-off conversion of a GGUF checkpoint to safetensors plus a tokenizer, so later loads take seconds."""

from __future__ import annotations

import json
from pathlib import Path

from voicepipe.models.manifest import CONVERTED_MANIFEST, sha256_file


def gguf_to_safetensors(model_dir: Path, gguf_name: str) -> None:
    """Dequantize ``model_dir/gguf_name`` to float32 safetensors in ``model_dir`` and record checksums."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, gguf_file=gguf_name)
    model = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=gguf_name, dtype=torch.float32)
    # The weights are dequantized on load; drop the GGUF quantizer so transformers will serialize them.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    before = {p.name for p in model_dir.iterdir()}
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    produced = sorted(p for p in model_dir.iterdir() if p.is_file() and p.name not in before)
    checksums = {p.name: sha256_file(p) for p in produced}
    (model_dir / CONVERTED_MANIFEST).write_text(json.dumps(checksums, indent=2) + "\n")


CONVERTERS = {"gguf-to-safetensors": gguf_to_safetensors}
