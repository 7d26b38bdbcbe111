"""`voicepipe bench llm`'s ratios from a report's figures (pure arithmetic, no model)."""

from __future__ import annotations

import pytest

from voicepipe.llm.bench import _ratios


def level(ttfts: list[float], tokens_per_s: float = 10.0, decode: float = 12.0) -> dict:
    return {"ttft_p50_per_turn": ttfts, "cached_fraction_per_turn": [0.0] + [0.95] * (len(ttfts) - 1),
            "output_tokens_per_s": tokens_per_s, "decode_tokens_per_s_per_session": decode}


def test_ratios_over_turns_and_windows() -> None:
    ttfts = [0.5] + [0.1] * 5 + [0.12] * 19 + [0.15, 0.15, 0.3, 0.15, 0.15]  # 30 turns, turn 28 a slow one
    report = {"levels": {"1": level(ttfts), "16": level([0.5, 0.2, 0.2], tokens_per_s=60.0)},
              "baseline": {"tokens_per_s": 6.0, "decode_tokens_per_s": 12.5, "ttft_turn_last_over_turn2": 7.0}}
    ratios = _ratios(report)
    assert ratios["ttft_turn30_over_turn2"] == pytest.approx(1.5)
    assert ratios["ttft_last5_over_turns2to6"] == pytest.approx(1.5)  # the slow turn 28 is not the median
    assert ratios["cached_fraction_min_from_turn2"] == 0.95
    assert ratios["throughput_16_over_baseline"] == pytest.approx(10.0)
    assert ratios["single_decode_over_baseline"] == pytest.approx(0.96)


def test_no_window_ratio_for_a_short_run() -> None:
    report = {"levels": {"1": level([0.5, 0.1, 0.2])}}
    ratios = _ratios(report)
    assert ratios["ttft_turn30_over_turn2"] == pytest.approx(2.0)
    assert "ttft_last5_over_turns2to6" not in ratios
