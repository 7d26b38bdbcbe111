"""``voicepipe bench decode``: decode speed of the engine's paths, weight formats and speculation, in one run.

Configurations, all on the default model, greedy, replies of up to ``max_tokens`` tokens (ending at EOS as calls
do), voice-agent prompts (a short system prompt, a caller's question; half of them ask for details to be read back):

- ``baseline``: transformers ``generate`` (one prompt at a time; 16 prompts as one left-padded batch);
- ``fp32``: today's engine path (transformers' modules, oneDNN-packed float32: ``llm.fast_decoder = false``);
- ``fp32_decoder``: voicepipe's decoder in float32; ``q4``, ``fp16`` and ``int8``: the decoder in those weight
  formats; ``*_spec``: with prompt-lookup speculation (``llm.speculative = "ngram"``). The ``engine_best`` keys are
  the better of the format ``auto`` picks on this machine (on these CPUs q4: lossless for SmolLM2's Q4_1 weights;
  int8 fails the quality bound) with and without speculation;
- ``llamacpp``: llama.cpp on the model directory's GGUF, single stream, where ``llama-cpp-python`` is installed
  (optional, never in CI); ``best_over_llamacpp`` is ``engine_best`` over it.

Single stream: the prompts one at a time, each configuration in turn per prompt (so a drift of the shared machine
lands on all of them), decode tokens/s = tokens after the first / time from the first to the last. 16 sessions: 16
requests at once, throughput = tokens / wall time (prefill included), each configuration twice (in order, then in
reverse order), averaged. The engine's step profile (``LLMEngine.step_profile``) splits each step into scheduling,
proposing, inputs (host-to-device copies off the CPU), forward, sampling and bookkeeping.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

SYSTEM = ("You are the phone assistant of Harbor Lights Bistro. Answer in one or two short sentences that are easy "
          "to say out loud, and read names, numbers and times back exactly as the caller gave them.")
PROMPTS = [
    "Hi, I'd like to book a table for four this Friday at seven thirty, under the name Rivera. Can you confirm?",
    "What time do you open on Sundays, and do you take reservations for the patio?",
    "My phone number is 555 0192 and my name is Daniel Okafor. Please read both back to me.",
    "Do you have anything vegetarian on the tasting menu, and how much is the wine pairing?",
    "Can you move my booking from Saturday at eight to Sunday at six thirty, same party of six?",
    "Is there parking near the restaurant, and is it free in the evening?",
    "I need to cancel reservation number 4 4 1 7 for tomorrow night. Can you confirm the number back?",
    "Tell me about your desserts, please. Is the chocolate cake gluten free?",
]

CONFIGS: dict[str, dict[str, Any]] = {
    "fp32": {"fast_decoder": False, "weights": "fp32", "speculative": "off"},
    "fp32_decoder": {"weights": "fp32", "speculative": "off"},
    "q4": {"weights": "q4", "speculative": "off"},
    "q4_spec": {"weights": "q4", "speculative": "ngram"},
    "fp16": {"weights": "fp16", "speculative": "off"},
    "fp16_spec": {"weights": "fp16", "speculative": "ngram"},
    "int8": {"weights": "int8", "speculative": "off"},
    "int8_spec": {"weights": "int8", "speculative": "ngram"},
}
PHASES = ("schedule", "propose", "inputs", "forward", "sample", "bookkeeping")


def _messages(prompt: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]


def profile_per_step(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Milliseconds per step of each phase between two ``step_profile`` readings, and the non-forward total."""
    steps = after["steps"] - before["steps"]
    if steps <= 0:
        return {}
    out = {phase: round((after[phase] - before[phase]) / steps * 1000, 3) for phase in PHASES}
    out["overhead"] = round(sum(v for k, v in out.items() if k != "forward"), 3)
    out["steps"] = int(steps)
    out["rows_per_step"] = round((after["decode_rows"] - before["decode_rows"]) / steps, 2)
    return out


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    """The issue's flat keys from the per-configuration figures."""
    single, multi = report["single"], report["sessions"]
    auto = report["workload"]["auto_weights"]
    passing = (auto, f"{auto}_spec")  # the configurations auto would run (it picks formats that pass the bound)
    flat: dict[str, Any] = {"baseline_tok_s": single["baseline"]["tok_s"],
                            "baseline_16_tok_s": multi["baseline"]["tok_s"]}
    for name in CONFIGS:
        flat[f"engine_{name}_tok_s"] = single[name]["tok_s"]
        flat[f"engine_{name}_16_tok_s"] = multi[name]["tok_s"]
    best = max(passing, key=lambda name: single[name]["tok_s"])
    best16 = max(passing, key=lambda name: multi[name]["tok_s"])
    flat["engine_best"] = best
    flat["engine_best_tok_s"] = single[best]["tok_s"]
    flat["engine_best_16_tok_s"] = multi[best16]["tok_s"]
    flat["speedup_best_over_fp32"] = round(single[best]["tok_s"] / single["fp32"]["tok_s"], 3)
    flat["throughput_16_best_over_fp32"] = round(multi[best16]["tok_s"] / multi["fp32"]["tok_s"], 3)
    flat["speedup_int8_spec_over_fp32"] = round(single["int8_spec"]["tok_s"] / single["fp32"]["tok_s"], 3)
    flat["throughput_16_int8_over_fp32"] = round(max(multi["int8"]["tok_s"], multi["int8_spec"]["tok_s"])
                                                 / multi["fp32"]["tok_s"], 3)
    flat["spec_acceptance_rate"] = single[best if best.endswith("_spec") else f"{best}_spec"]["acceptance_rate"]
    flat["step_overhead_ms"] = single[best]["profile"].get("overhead")
    if "llamacpp" in single:
        flat["llamacpp_tok_s"] = single["llamacpp"]["tok_s"]
        flat["best_over_llamacpp"] = round(single[best]["tok_s"] / single["llamacpp"]["tok_s"], 3)
    return flat


class _Decode:
    """Single-stream decode figures of one configuration: tokens after the first and the time they took."""

    def __init__(self) -> None:
        self.tokens = 0
        self.seconds = 0.0
        self.outputs: list[list[int]] = []

    def add(self, token_times: list[float], token_ids: list[int]) -> None:
        if len(token_times) >= 2:
            self.tokens += len(token_times) - 1
            self.seconds += token_times[-1] - token_times[0]
        self.outputs.append(token_ids)

    @property
    def tok_s(self) -> float:
        return round(self.tokens / self.seconds, 2) if self.seconds > 0 else 0.0


async def _engine_single(engine, prompt: str, max_tokens: int) -> tuple[list[float], list[int]]:
    gen = engine.generate(None, _messages(prompt), max_tokens=max_tokens)
    async for _ in gen:
        pass
    return gen.stats.token_times, gen.token_ids


async def _engine_sessions(engine, n: int, max_tokens: int) -> tuple[int, float]:
    gens = [engine.generate(None, _messages(f"{PROMPTS[i % len(PROMPTS)]} (call {i + 1})"), max_tokens=max_tokens)
            for i in range(n)]
    start = time.perf_counter()

    async def drain(gen) -> None:
        async for _ in gen:
            pass

    await asyncio.gather(*(drain(g) for g in gens))
    return sum(len(g.token_ids) for g in gens), time.perf_counter() - start


class _Baseline:
    """transformers ``generate`` on its own copy of the model."""

    def __init__(self, model, tokenizer) -> None:
        self.model, self.tokenizer = model, tokenizer

    def single(self, prompt: str, max_tokens: int) -> tuple[list[float], list[int]]:
        import torch

        from voicepipe.llm.bench import _TimingStreamer

        ids = self.tokenizer.apply_chat_template(_messages(prompt), add_generation_prompt=True, return_dict=False)
        streamer = _TimingStreamer()
        with torch.inference_mode():
            out = self.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                      do_sample=False, max_new_tokens=max_tokens, streamer=streamer)
        return streamer.times, out[0, len(ids):].tolist()

    def sessions(self, n: int, max_tokens: int) -> tuple[int, float]:
        import torch

        tok = self.tokenizer
        texts = [tok.apply_chat_template(_messages(f"{PROMPTS[i % len(PROMPTS)]} (call {i + 1})"),
                                         add_generation_prompt=True, tokenize=False) for i in range(n)]
        side = tok.padding_side
        tok.padding_side = "left"
        try:
            batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        finally:
            tok.padding_side = side
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(**batch, do_sample=False, max_new_tokens=max_tokens,
                                      pad_token_id=tok.pad_token_id or tok.eos_token_id)
        wall = time.perf_counter() - start
        new = out[:, batch["input_ids"].shape[1]:]
        eos = tok.eos_token_id
        tokens = 0
        for row in new.tolist():  # up to and including the first EOS: what an engine reply holds
            tokens += row.index(eos) + 1 if eos in row else len(row)
        return tokens, wall


class _LlamaCpp:
    """llama.cpp on the model's GGUF (llama-cpp-python: optional, never in CI), on the engine's thread count
    (llama.cpp's default is half the cores), in a process of its own: in the bench's, once an engine's thread had
    run OpenMP regions the process had more OpenMP threads than cores, libgomp then slept between barriers instead
    of spinning, and llama.cpp's decode (an OpenMP barrier between every two ops) fell to a third (95 -> 33 tok/s)."""

    def __init__(self, gguf, threads: int) -> None:
        import multiprocessing

        self.gguf, self.threads = gguf, threads
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve_llamacpp, args=(child, str(gguf), threads), daemon=True,
                                       name="llama.cpp")
        self.process.start()

    @classmethod
    def load(cls, path, threads: int) -> _LlamaCpp | None:
        """None where llama-cpp-python is not installed or the model directory has no GGUF."""
        import importlib.util

        ggufs = sorted(path.glob("*.gguf"))
        return cls(ggufs[0], threads) if ggufs and importlib.util.find_spec("llama_cpp") else None

    def single(self, prompt: str, max_tokens: int) -> tuple[list[float], list[int]]:
        """The time of each streamed piece (one a token; no ids: nothing compares llama.cpp's tokens)."""
        self.conn.send((prompt, max_tokens))
        return self.conn.recv(), []

    def close(self) -> None:
        self.conn.send(None)
        self.process.join(timeout=30)


def _serve_llamacpp(conn, gguf: str, threads: int) -> None:
    """The llama.cpp process: a reply's piece times (``time.perf_counter``, one clock for every process) for each
    (prompt, max_tokens) it receives, until it receives None or the bench has gone."""
    from llama_cpp import Llama

    llm = Llama(model_path=gguf, n_ctx=2048, n_threads=threads, n_threads_batch=threads, verbose=False)
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        prompt, max_tokens = job
        conn.send([time.perf_counter() for chunk in llm.create_chat_completion(
            _messages(prompt), max_tokens=max_tokens, temperature=0.0, stream=True)
            if chunk["choices"][0]["delta"].get("content")])


def run_decode_bench(settings, max_tokens: int = 64, sessions: int = 16, prompts: int = len(PROMPTS),
                     progress=print) -> dict[str, Any]:
    import torch

    from voicepipe.devices import llm_dtype_name, resolve_device
    from voicepipe.llm.engine import LLMEngine
    from voicepipe.llm.loader import load_causal_lm
    from voicepipe.llm.quality import choose_weights
    from voicepipe.models import resolve_model

    device = resolve_device(settings.device)
    path = resolve_model(settings.models.llm, "llm", settings.paths.models_dir)
    dtype = llm_dtype_name(settings.device)
    torch.set_grad_enabled(False)
    model, tokenizer = load_causal_lm(path, device, dtype)
    base_model, _ = load_causal_lm(path, device, dtype)  # transformers' generate, untouched
    today_model, _ = load_causal_lm(path, device, dtype)  # today's path patches its linears
    baseline = _Baseline(base_model, tokenizer)
    llamacpp = _LlamaCpp.load(path, torch.get_num_threads())
    engines = {}
    for name, update in CONFIGS.items():
        llm = settings.llm.model_copy(update={"kv_cache_mib": 256, "max_running": max(sessions, 16), **update})
        engines[name] = LLMEngine(today_model if name == "fp32" else model, tokenizer, llm)
        engines[name].start()
        progress(f"{name}: weights {engines[name].weights.format} ({engines[name].weights.reason})")
    auto, _ = choose_weights(model, tokenizer, "auto")  # its quality checks are the engines' (remembered per model)
    progress(f"auto: weights {auto.format} ({auto.reason})")
    chosen = PROMPTS[:prompts]
    report: dict[str, Any] = {
        "workload": {"max_tokens": max_tokens, "sessions": sessions, "prompts": len(chosen), "device": device,
                     "torch_threads": torch.get_num_threads(), "configs": CONFIGS, "auto_weights": auto.format},
        "single": {}, "sessions": {}}
    try:
        for engine in engines.values():  # warm-up: first-call costs stay out of the figures
            asyncio.run(_engine_single(engine, chosen[0], 4))
        others = {"baseline": baseline, **({"llamacpp": llamacpp} if llamacpp else {})}
        for other in others.values():
            other.single(chosen[0], 4)
        decodes = {name: _Decode() for name in (*others, *engines)}
        before = {name: engine.step_profile() for name, engine in engines.items()}
        counters = {name: dict(engine.counters) for name, engine in engines.items()}
        for i, prompt in enumerate(chosen):
            progress(f"single stream: prompt {i + 1}/{len(chosen)}")
            for name, other in others.items():
                decodes[name].add(*other.single(prompt, max_tokens))
            for name, engine in engines.items():
                decodes[name].add(*asyncio.run(_engine_single(engine, prompt, max_tokens)))
        for name, decode in decodes.items():
            row: dict[str, Any] = {"tok_s": decode.tok_s, "tokens": decode.tokens}
            if name in engines:
                engine = engines[name]
                row["profile"] = profile_per_step(before[name], engine.step_profile())
                drafted = engine.counters["draft_tokens"] - counters[name]["draft_tokens"]
                accepted = engine.counters["accepted_tokens"] - counters[name]["accepted_tokens"]
                row["acceptance_rate"] = round(accepted / drafted, 3) if drafted else None
                row["same_tokens_as_fp32"] = _agreement(decodes["fp32"].outputs, decode.outputs)
            elif name == "llamacpp":
                row.update(gguf=llamacpp.gguf.name, threads=llamacpp.threads)
            report["single"][name] = row
            progress(f"  {name}: {row['tok_s']} tok/s")
        order = list(engines)
        totals = {name: [0, 0.0] for name in ("baseline", *engines)}
        profiles = {}
        for round_no, names in enumerate((order, order[::-1])):
            progress(f"{sessions} sessions: round {round_no + 1}/2")
            tokens, wall = baseline.sessions(sessions, max_tokens)
            totals["baseline"][0] += tokens
            totals["baseline"][1] += wall
            for name in names:
                start = engines[name].step_profile()
                tokens, wall = asyncio.run(_engine_sessions(engines[name], sessions, max_tokens))
                totals[name][0] += tokens
                totals[name][1] += wall
                profiles[name] = profile_per_step(start, engines[name].step_profile())
        for name, (tokens, wall) in totals.items():
            report["sessions"][name] = {"tok_s": round(tokens / wall, 2), "tokens": tokens, "wall_s": round(wall, 2),
                                        **({"profile": profiles[name]} if name in profiles else {})}
            progress(f"  {name}: {report['sessions'][name]['tok_s']} tok/s")
    finally:
        for engine in engines.values():
            engine.stop()
        if llamacpp is not None:
            llamacpp.close()
    report.update(summarize(report))
    return report


def _agreement(reference: list[list[int]], outputs: list[list[int]]) -> float:
    """The mean fraction of each reference reply that ``outputs`` reproduce before their first differing token."""
    fractions = []
    for ref, out in zip(reference, outputs, strict=False):
        same = next((i for i, (a, b) in enumerate(zip(ref, out, strict=False)) if a != b), min(len(ref), len(out)))
        fractions.append(same / max(1, len(ref)))
    return round(sum(fractions) / len(fractions), 3) if fractions else 0.0
