"""`voicepipe bench llm` on a tiny workload with the real SmolLM2: the JSON report holds every figure the engine
issue names, measured from real engine and baseline runs (not their speed: that is the benchmark's job)."""

from __future__ import annotations

import json

from voicepipe.config import Settings
from voicepipe.llm.bench import run_llm_bench

TURNS, REPLY = 3, 4


def test_the_report_holds_per_turn_figures_and_ratios(settings: Settings) -> None:
    report = run_llm_bench(settings, turns=TURNS, concurrency=(1, 2), reply_tokens=REPLY, system_tokens=40,
                           stagger_s=0.0, single_sessions=2, progress=lambda _line: None)
    one, two = report["levels"]["1"], report["levels"]["2"]
    assert one["sessions"] == 2 and two["sessions"] == 2  # the 1-session level's turns come from 2 conversations
    assert one["output_tokens"] == two["output_tokens"] == 2 * TURNS * REPLY  # EOS ignored: fixed-length replies
    for level in (one, two):
        assert len(level["ttft_p50_per_turn"]) == TURNS and all(t > 0 for t in level["ttft_p50_per_turn"])
        assert all(f > 0.5 for f in level["cached_fraction_per_turn"][1:])  # later turns reuse the conversation
        assert level["kv_bytes_per_token"] > 0 and level["peak_rss_mib"] > 0
        # a reply's first two tokens are always a step apart; with speculation, tokens verified together arrive
        # together (gaps of 0), so the median gap may be 0
        assert level["itl_p95"] > 0 and level["itl_p50"] >= 0 and level["output_tokens_per_s"] > 0
    base = report["baseline"]
    prompts = base["prompt_tokens_per_turn"]
    assert len(base["ttft_per_turn"]) == TURNS and all(a < b for a, b in zip(prompts, prompts[1:], strict=False))
    ratios = report["ratios"]
    assert ratios["ttft_turn30_over_turn2"] == one["ttft_p50_per_turn"][-1] / one["ttft_p50_per_turn"][1]
    assert ratios["cached_fraction_min_from_turn2"] == min(f for lvl in (one, two)
                                                           for f in lvl["cached_fraction_per_turn"][1:])
    assert ratios["throughput_16_over_baseline"] == two["output_tokens_per_s"] / base["tokens_per_s"]
    assert ratios["throughput_level_used"] == 2 and ratios["single_decode_over_baseline"] > 0
    assert json.loads(json.dumps(report)) == report  # a script can read it back
