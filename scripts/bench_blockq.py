"""The q4 kernels against the other formats' matmuls, for SmolLM2's layer linears (fused q/k/v and gate/up shapes).

For each row count, the 120 linears of the default model are multiplied in each format, min of ``--rounds``
timings, formats interleaved per round (the machine is shared): q4 (``blockq``'s native kernel), fbgemm's fp16,
oneDNN's packed float32. It shows where the native kernel stops paying (``blockq.FEW_ROWS``).

    python scripts/bench_blockq.py --rows 1 2 4 8 16 --json out.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from safetensors.torch import load_file

from voicepipe.config import load_settings
from voicepipe.llm import blockq, prepack
from voicepipe.models import resolve_model


def layer_weights(model_dir) -> list[torch.Tensor]:
    sd = load_file(str(model_dir / "model.safetensors"))
    layers = sorted({int(k.split(".")[2]) for k in sd if k.startswith("model.layers.")})
    out = []
    for i in layers:
        p = f"model.layers.{i}."
        out.append(torch.cat([sd[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]))
        out.append(sd[p + "self_attn.o_proj.weight"])
        out.append(torch.cat([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]]))
        out.append(sd[p + "mlp.down_proj.weight"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    settings = load_settings()
    weights = layer_weights(resolve_model(settings.models.llm, "llm", settings.paths.models_dir))
    kernels = blockq.native()
    q4 = [blockq.quantize(w) for w in weights]
    fp16 = [torch.ops.quantized.linear_prepack_fp16(w, None) for w in weights]
    fp32 = [prepack.pack(w) for w in weights]
    formats = {
        "q4": lambda xs: [kernels.linear(x, b) for x, b in zip(xs, q4, strict=True)],
        "fp16": lambda xs: [torch.ops.quantized.linear_dynamic_fp16(x, p) for x, p in zip(xs, fp16, strict=True)],
        "fp32": lambda xs: [prepack.packed_linear(x, p, None) for x, p in zip(xs, fp32, strict=True)],
    }
    report = {"linears": len(weights), "threads": torch.get_num_threads(), "few_rows": blockq.FEW_ROWS, "rows": {}}
    with torch.inference_mode():
        for rows in args.rows:
            xs = [torch.randn(rows, w.shape[1]) for w in weights]
            best = {name: float("inf") for name in formats}
            for _ in range(args.rounds):
                for name, run in formats.items():
                    start = time.perf_counter()
                    run(xs)
                    best[name] = min(best[name], time.perf_counter() - start)
            row = {f"{name}_ms": round(s * 1000, 2) for name, s in best.items()}
            row["q4_over_fp16"] = round(best["fp16"] / best["q4"], 3)
            row["q4_over_fp32"] = round(best["fp32"] / best["q4"], 3)
            report["rows"][rows] = row
            print(rows, row, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
