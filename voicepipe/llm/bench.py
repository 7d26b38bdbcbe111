"""``voicepipe bench llm``: multi-turn voice-agent workload on the engine, against a re-prefill baseline.

Workload: a shared system prompt of about ``system_tokens`` tokens; ``turns`` turns per session, each a user message
of 20-40 tokens and a reply of ``reply_tokens`` tokens (EOS ignored by default, for fixed lengths); concurrency
levels (default 1, 4, 16) with session starts staggered. The 1-session level holds ``single_sessions``
conversations (3) whose turns take turns, never two at once, so each turn's TTFT p50 is a median of 3, not one
sample. In the same run, the baseline: transformers ``generate`` with the whole conversation re-sent every turn, one
session, which is what voice frameworks do today.

Absolute times on a shared CPU mean little; the report's ``ratios`` compare against the baseline of the same run.
"""

from __future__ import annotations

import asyncio
import logging
import random
import resource
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

_WORD_TEXT = """order bread cake delivery morning price loaf butter croissant pickup tomorrow friday birthday
chocolate lemon sugar gluten vegan address street minutes window card cash receipt box dozen slice fresh oven
weekend holiday reserve change cancel number name table party coffee tea milk almond cinnamon apple"""
_WORDS = tuple(_WORD_TEXT.split())

_SYSTEM_SENTENCES = [
    "You are the phone assistant of Crumb and Company, a neighbourhood bakery.",
    "Speak in short, friendly sentences that are easy to say out loud.",
    "The shop opens at seven in the morning on weekdays and at eight on Saturdays, and it is closed on Sundays.",
    "A sourdough loaf costs six dollars, a baguette three dollars and a croissant two dollars fifty.",
    "Birthday cakes need two days of notice and start at thirty five dollars for a small one.",
    "Orders above forty dollars get free delivery within five miles; otherwise delivery costs four dollars.",
    "Always confirm the caller's name, the items, the pickup or delivery time and the total before ending.",
    "If the caller asks for something we do not sell, suggest the closest thing we do sell.",
    "Never invent prices that are not listed here; offer to have a baker call back instead.",
    "Gluten free bread is baked on Tuesdays and Fridays only, and vegan croissants on weekends.",
]


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def _rss_mib() -> float:
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**20
    except ImportError:  # pragma: no cover
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass
class Workload:
    system: str
    user_turns: list[list[str]]  # per session slot, one message per turn
    reply_tokens: int
    ignore_eos: bool

    @property
    def turns(self) -> int:
        return len(self.user_turns[0])


def build_workload(tokenizer, sessions: int, turns: int, reply_tokens: int, system_tokens: int = 300,
                   ignore_eos: bool = True, seed: int = 0) -> Workload:
    rng = random.Random(seed)
    system, i = "", 0
    while len(tokenizer(system, add_special_tokens=False)["input_ids"]) < system_tokens:
        system += ("" if not system else " ") + _SYSTEM_SENTENCES[i % len(_SYSTEM_SENTENCES)]
        i += 1
    users = []
    for _ in range(sessions):
        msgs = []
        for _ in range(turns):
            target = rng.randint(20, 40)
            words: list[str] = []
            while len(tokenizer(" ".join(words), add_special_tokens=False)["input_ids"]) < target:
                words.append(rng.choice(_WORDS))
            msgs.append(" ".join(words).capitalize() + "?")
        users.append(msgs)
    return Workload(system, users, reply_tokens, ignore_eos)


@dataclass
class TurnRecord:
    session: int
    turn: int
    ttft: float
    itls: list[float]
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    decode_time: float  # first token -> last token


@dataclass
class LevelResult:
    concurrency: int
    wall_s: float
    records: list[TurnRecord] = field(default_factory=list)
    engine_stats: dict[str, Any] = field(default_factory=dict)
    rss_mib: float = 0.0
    peak_rss_mib: float = 0.0


def _summarize(records: list[TurnRecord], turns: int, wall_s: float) -> dict[str, Any]:
    ttfts = [r.ttft for r in records]
    itls = [x for r in records for x in r.itls]
    out_tokens = sum(r.output_tokens for r in records)
    per_turn_ttft, per_turn_cached = [], []
    for t in range(turns):
        rows = [r for r in records if r.turn == t]
        per_turn_ttft.append(statistics.median(r.ttft for r in rows) if rows else None)
        per_turn_cached.append(statistics.mean(r.cached_tokens / r.prompt_tokens for r in rows) if rows else None)
    decode_tokens = sum(r.output_tokens - 1 for r in records)
    decode_time = sum(r.decode_time for r in records)
    return {
        "turns": turns,
        "sessions": len({r.session for r in records}),
        "ttft_p50_per_turn": per_turn_ttft,
        "ttft_p50": _pct(ttfts, 0.5), "ttft_p95": _pct(ttfts, 0.95), "ttft_p99": _pct(ttfts, 0.99),
        "itl_p50": _pct(itls, 0.5), "itl_p95": _pct(itls, 0.95),
        "output_tokens": out_tokens,
        "wall_s": wall_s,
        "output_tokens_per_s": out_tokens / wall_s if wall_s > 0 else None,
        "decode_tokens_per_s_per_session": decode_tokens / decode_time if decode_time > 0 else None,
        "cached_fraction_per_turn": per_turn_cached,
        "prompt_tokens_per_turn": [statistics.mean(r.prompt_tokens for r in records if r.turn == t)
                                   for t in range(turns) if any(r.turn == t for r in records)],
    }


# -- engine ------------------------------------------------------------------------------------------------------
async def _engine_turn(engine, session, work: Workload, slot: int, turn: int) -> TurnRecord:
    gen = engine.generate(session, [{"role": "user", "content": work.user_turns[slot][turn]}],
                          max_tokens=work.reply_tokens, ignore_eos=work.ignore_eos)
    async for _ in gen:
        pass
    st = gen.stats
    times = st.token_times
    return TurnRecord(slot, turn, st.ttft, st.itls, st.prompt_tokens, st.cached_prompt_tokens, st.output_tokens,
                      times[-1] - times[0] if times else 0.0)


async def _run_session(engine, work: Workload, slot: int, delay: float, records: list[TurnRecord]) -> None:
    await asyncio.sleep(delay)
    session = engine.open_session(work.system)
    try:
        for turn in range(work.turns):
            records.append(await _engine_turn(engine, session, work, slot, turn))
    finally:
        engine.close_session(session)


async def _run_level(engine, work: Workload, concurrency: int, stagger_s: float) -> LevelResult:
    records: list[TurnRecord] = []
    start = time.perf_counter()
    await asyncio.gather(*(_run_session(engine, work, i, i * stagger_s, records) for i in range(concurrency)))
    wall = time.perf_counter() - start
    return LevelResult(concurrency, wall, records)


# -- baseline ----------------------------------------------------------------------------------------------------
class _TimingStreamer:
    """A transformers streamer that timestamps every generated token (the first ``put`` is the prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


class Baseline:
    """What voice frameworks do today: re-send the whole conversation every turn through ``model.generate``."""

    def __init__(self, model, tokenizer, work: Workload) -> None:
        self.model, self.tokenizer, self.work = model, tokenizer, work
        self.messages = [{"role": "system", "content": work.system}]
        self.records: list[TurnRecord] = []
        self.busy_s = 0.0

    def turn(self, turn: int) -> TurnRecord:
        import torch

        tok, model, work = self.tokenizer, self.model, self.work
        self.messages.append({"role": "user", "content": work.user_turns[0][turn]})
        start = time.perf_counter()
        ids = tok.apply_chat_template(self.messages, add_generation_prompt=True, return_dict=False)
        streamer = _TimingStreamer()
        kwargs = {"min_new_tokens": work.reply_tokens} if work.ignore_eos else {}
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids], device=model.device), do_sample=False,
                                 max_new_tokens=work.reply_tokens, streamer=streamer,
                                 attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=model.device),
                                 **kwargs)
        self.busy_s += time.perf_counter() - start
        reply = out[0, len(ids):].tolist()
        times = streamer.times
        record = TurnRecord(0, turn, times[0] - start, [b - a for a, b in zip(times, times[1:], strict=False)],
                            len(ids), 0, len(reply), times[-1] - times[0])
        self.records.append(record)
        content = reply[:-1] if reply and reply[-1] == tok.eos_token_id else reply
        self.messages.append({"role": "assistant", "content": tok.decode(content, skip_special_tokens=True)})
        return record

    def report(self) -> dict[str, Any]:
        records = self.records
        summary = _summarize(records, len(records), self.busy_s)
        return {"ttft_per_turn": [r.ttft for r in records], "tokens_per_s": summary["output_tokens_per_s"],
                "decode_tokens_per_s": summary["decode_tokens_per_s_per_session"],
                "itl_p50": summary["itl_p50"], "prompt_tokens_per_turn": [r.prompt_tokens for r in records],
                "busy_s": self.busy_s,
                "ttft_turn_last_over_turn2": (records[-1].ttft / records[1].ttft) if len(records) >= 2 else None}


async def _run_one_at_a_time(engine, baseline: Baseline | None, work: Workload, sessions: int) -> LevelResult:
    """The 1-session level: ``sessions`` conversations (each with its own caller's messages) whose turns never
    overlap, and the baseline, turn by turn in lockstep, so all see the same machine load. A turn's TTFT p50 is
    then a median over those conversations, not one sample of a noisy machine."""
    records: list[TurnRecord] = []
    engine_s = 0.0
    opened = [engine.open_session(work.system) for _ in range(sessions)]
    try:
        for turn in range(work.turns):
            for slot, session in enumerate(opened):
                start = time.perf_counter()
                records.append(await _engine_turn(engine, session, work, slot, turn))
                engine_s += time.perf_counter() - start
            if baseline is not None:
                await asyncio.to_thread(baseline.turn, turn)
    finally:
        for session in opened:
            engine.close_session(session)
    return LevelResult(1, engine_s, records)


# -- the whole benchmark -------------------------------------------------------------------------------------------
def run_llm_bench(settings, turns: int = 30, concurrency: tuple[int, ...] = (1, 4, 16), reply_tokens: int = 40,
                  system_tokens: int = 300, ignore_eos: bool = True, baseline: bool = True, stagger_s: float = 0.5,
                  kv_cache_mib: int | None = None, seed: int = 0, single_sessions: int = 3,
                  progress=print) -> dict[str, Any]:
    import torch

    from voicepipe.devices import llm_dtype_name, resolve_device
    from voicepipe.llm.engine import LLMEngine
    from voicepipe.llm.loader import load_causal_lm
    from voicepipe.models import resolve_model

    device = resolve_device(settings.device)
    dtype = llm_dtype_name(settings.device)
    path = resolve_model(settings.models.llm, "llm", settings.paths.models_dir)
    torch.set_grad_enabled(False)
    model, tokenizer = load_causal_lm(path, device, dtype)
    max_c = max(*concurrency, single_sessions if 1 in concurrency else 1)
    work = build_workload(tokenizer, max_c, turns, reply_tokens, system_tokens, ignore_eos, seed)
    report: dict[str, Any] = {
        "workload": {"turns": turns, "concurrency": list(concurrency), "reply_tokens": reply_tokens,
                     "system_tokens": len(tokenizer(work.system, add_special_tokens=False)["input_ids"]),
                     "ignore_eos": ignore_eos, "stagger_s": stagger_s, "device": device, "dtype": dtype,
                     "torch_threads": torch.get_num_threads(), "single_sessions": single_sessions,
                     "baseline_mode": ("turn by turn in lockstep with the 1-session level" if 1 in concurrency
                                       else "on its own, after the engine levels")},
        "levels": {},
    }

    llm = settings.llm
    if kv_cache_mib is None:  # enough for every session's whole conversation, so nothing is evicted
        cfg = model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * model.dtype.itemsize
        need = max_c * (len(tokenizer(work.system)["input_ids"]) + turns * (60 + reply_tokens)) * per_token
        kv_cache_mib = max(64, int(need * 1.2 / 2**20))
    llm = llm.model_copy(update={"kv_cache_mib": kv_cache_mib, "max_running": max(llm.max_running, max_c)})
    engine = LLMEngine(model, tokenizer, llm)
    engine.start()
    base = None
    if baseline:
        base_model, _ = load_causal_lm(path, device, dtype)
        base = Baseline(base_model, tokenizer, work)
    try:
        for c in concurrency:
            if c == 1:
                progress(f"engine: 1 session at a time ({single_sessions} conversations, turns taking turns) x "
                         f"{turns} turns" + (", in lockstep with the baseline (generate, full prompt)" if base else ""))
                result = asyncio.run(_run_one_at_a_time(engine, base, work, single_sessions))
            else:
                progress(f"engine: {c} session(s) x {turns} turns")
                result = asyncio.run(_run_level(engine, work, c, stagger_s))
            summary = _summarize(result.records, turns, result.wall_s)
            summary["peak_rss_mib"] = _peak_rss_mib()
            summary["rss_mib"] = _rss_mib()
            summary["kv_bytes_per_token"] = engine.runner.bytes_per_token
            summary["engine"] = engine.stats()
            report["levels"][str(c)] = summary
            progress(f"  {summary['output_tokens_per_s']:.2f} tok/s, TTFT p50 {summary['ttft_p50']:.3f} s, "
                     f"ITL p50 {summary['itl_p50']:.3f} s")
        if base is not None:
            if not base.records:  # no single-session level: measure the baseline on its own
                progress(f"baseline: transformers generate, full prompt every turn, {turns} turns")
                for turn in range(turns):
                    base.turn(turn)
            report["baseline"] = base.report()
            progress(f"  baseline {report['baseline']['tokens_per_s']:.2f} tok/s, "
                     f"TTFT turn 2 {report['baseline']['ttft_per_turn'][1]:.3f} s, "
                     f"last {report['baseline']['ttft_per_turn'][-1]:.3f} s")
    finally:
        engine.stop()
    report["ratios"] = _ratios(report)
    return report


def _ratios(report: dict[str, Any]) -> dict[str, Any]:
    levels = report["levels"]
    ratios: dict[str, Any] = {}
    one = levels.get("1")
    if one and len(one["ttft_p50_per_turn"]) >= 2:
        per_turn = one["ttft_p50_per_turn"]
        ratios["ttft_turn30_over_turn2"] = per_turn[-1] / per_turn[1]
        ratios["ttft_turn30_over_turn2_turns"] = [2, len(per_turn)]
        if len(per_turn) >= 11:  # the same over windows of five turns, which one slow turn moves less
            ratios["ttft_last5_over_turns2to6"] = statistics.median(per_turn[-5:]) / statistics.median(per_turn[1:6])
    fractions = [f for lvl in levels.values() for f in lvl["cached_fraction_per_turn"][1:] if f is not None]
    ratios["cached_fraction_min_from_turn2"] = min(fractions) if fractions else None
    base = report.get("baseline")
    if base:
        if "16" in levels or levels:
            top = levels.get("16") or levels[max(levels, key=int)]
            ratios["throughput_16_over_baseline"] = top["output_tokens_per_s"] / base["tokens_per_s"]
            ratios["throughput_level_used"] = int(max(levels, key=int)) if "16" not in levels else 16
        if one and one["decode_tokens_per_s_per_session"] and base["decode_tokens_per_s"]:
            ratios["single_decode_over_baseline"] = one["decode_tokens_per_s_per_session"] / base["decode_tokens_per_s"]
        ratios["baseline_ttft_turn30_over_turn2"] = base["ttft_turn_last_over_turn2"]
    return ratios
