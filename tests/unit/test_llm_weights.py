"""The weight formats' kernels against a plain float32 matmul, and what happens when a format cannot run here: a
clear line in the log and the format ``auto`` would pick, not a crash. The formats' quality on the real model is
held in tests/e2e/test_llm_weights.py."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from voicepipe.llm import quality, weights
from voicepipe.llm.weights import (
    Fp16Linear,
    Int8Linear,
    PackedLinear,
    WeightOnlyInt8Linear,
    auto_candidates,
    make_linear,
    smoothing,
    unsupported_reason,
)


def case(out_features: int = 96, in_features: int = 64, rows: int = 5):
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(out_features, in_features, generator=g)
    bias = torch.randn(out_features, generator=g)
    x = torch.randn(rows, in_features, generator=g)
    x[:, 3] *= 30  # an outlier channel, as LLM activations have
    return weight, bias, x


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm() / want.norm()).item()


@torch.inference_mode()
def test_int8_is_close_and_each_row_is_exactly_what_it_is_alone() -> None:
    weight, bias, x = case()
    want = torch.nn.functional.linear(x, weight, bias)
    lin = Int8Linear(weight, bias)
    got = lin(x)
    assert relative_error(got, want) < 0.03
    for i in range(len(x)):  # int32 sums of per-row quantized rows: batching changes no bit
        assert torch.equal(lin(x[i:i + 1]), got[i:i + 1])


@torch.inference_mode()
def test_smoothing_moves_an_outlier_channel_into_the_weights() -> None:
    weight, bias, x = case()
    s = smoothing(weight, x.abs().amax(dim=0))
    assert s[3] > 3 * s[torch.arange(64) != 3].median()
    want = torch.nn.functional.linear(x, weight, bias)
    plain = relative_error(Int8Linear(weight, bias)(x), want)
    smoothed = relative_error(Int8Linear(weight * s, bias)(x / s), want)
    assert smoothed < plain


@torch.inference_mode()
def test_fp16_packed_fp32_and_weight_only_int8_kernels() -> None:
    weight, bias, x = case()
    want = torch.nn.functional.linear(x, weight, bias)
    torch.testing.assert_close(Fp16Linear(weight, bias)(x), want, rtol=2e-3, atol=2e-2)
    torch.testing.assert_close(PackedLinear(weight, bias)(x), want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(make_linear("fp32", weight, bias, pack=False)(x), want)
    # the CUDA int8 kernel's arithmetic, run by torch's CPU implementation of the same op
    lin = WeightOnlyInt8Linear(weight, bias)
    dequantized = lin.qweight.float() * lin.scales[:, None]
    torch.testing.assert_close(lin(x), torch.nn.functional.linear(x, dequantized, bias), rtol=1e-4, atol=1e-3)
    assert relative_error(lin(x), want) < 0.01


def test_availability_of_each_format() -> None:
    cpu = torch.device("cpu")
    assert unsupported_reason("fp32", cpu) is None
    assert unsupported_reason("int8", cpu) is None and unsupported_reason("fp16", cpu) is None  # x86 torch: fbgemm
    assert "not available on meta" in unsupported_reason("int8", torch.device("meta"))
    assert "unknown weight format" in unsupported_reason("int4", cpu)
    assert auto_candidates(cpu)[-1] == "fp32" and auto_candidates(torch.device("cuda"))[0] == "bf16"


class WordTokenizer:
    """Enough of a tokenizer for the quality check's chat texts on a tiny model."""

    def apply_chat_template(self, messages, return_dict=False):
        return [sum(map(ord, word)) % 96 for m in messages for word in m["content"].split()]


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=16)).eval()


def test_an_unavailable_format_is_logged_and_auto_chooses(tiny_model, monkeypatch, caplog) -> None:
    real = quality.format_unsupported
    monkeypatch.setattr(quality, "format_unsupported",
                        lambda fmt, device: "no bf16 here (test)" if fmt == "bf16" else real(fmt, device))
    with caplog.at_level(logging.WARNING, logger="voicepipe.llm.quality"):
        choice, decoder = quality.choose_weights(tiny_model, WordTokenizer(), "bf16")
    assert "llm.weights = bf16 is not available: no bf16 here (test)" in caplog.text
    assert choice.format in auto_candidates(torch.device("cpu")) and choice.format != "bf16"
    assert decoder is not None and decoder.format == choice.format


def test_auto_takes_the_first_candidate_that_passes_the_check(tiny_model, monkeypatch) -> None:
    verdicts = {"q4": quality.QualityReport(0.97, 1.05), "int8": quality.QualityReport(0.95, 1.01),
                "fp16": quality.QualityReport(1.0, 1.0)}
    monkeypatch.setattr(quality, "check", lambda model, tokenizer, decoder: verdicts[decoder.format])
    choice, decoder = quality.choose_weights(tiny_model, WordTokenizer(), "auto")
    assert choice.format == "fp16" == decoder.format
    assert "int8 fails the quality check: argmax agreement 95.0%" in choice.reason
    assert "q4 fails the quality check: argmax agreement 97.0%" in choice.reason
    verdicts["int8"] = quality.QualityReport(0.995, 1.02)
    assert quality.choose_weights(tiny_model, WordTokenizer(), "auto")[0].format == "int8"
    verdicts["q4"] = quality.QualityReport(1.0, 1.0)
    assert quality.choose_weights(tiny_model, WordTokenizer(), "auto")[0].format == "q4"


def test_a_format_is_checked_against_the_model_itself(tiny_model) -> None:
    report = quality.check(tiny_model, WordTokenizer(), quality.build_decoder(tiny_model, WordTokenizer(), "fp32"))
    # a random model's logits are nearly flat: float32 reordering may flip a near-tie or two, no more
    assert report.agreement > 0.99 and report.ppl_ratio == pytest.approx(1.0, abs=1e-4) and report.passed
    assert weights.activation_dtype("bf16") == torch.bfloat16
