"""voicepipe's decoder against transformers' own forward, on tiny random models of each supported family (Llama
with and without biases, Mistral, Qwen2 with its qkv biases, Qwen3 with its q/k norms): the same logits for a
prompt, for decode steps on the paged pool, and with int8's smoothing folded into the weights (in float32, the
fold must not change the function). A model it cannot run goes through transformers' modules, with the reason."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from voicepipe.llm.decoder import Decoder, rotary_permutation, unsupported_reason
from voicepipe.llm.quality import calibrate, choose_weights, score
from voicepipe.llm.request import Request
from voicepipe.llm.runner import ModelRunner
from voicepipe.llm.sampling import SamplingParams
from voicepipe.llm.scheduler import ScheduledItem
from voicepipe.llm.session import Session

SHAPE = {"vocab_size": 96, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256}
FAMILIES = {
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**SHAPE)),
    "llama-biases": lambda: LlamaForCausalLM(LlamaConfig(**SHAPE, attention_bias=True, mlp_bias=True,
                                                         tie_word_embeddings=False)),
    "mistral": lambda: MistralForCausalLM(MistralConfig(**SHAPE)),
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**SHAPE)),
    "qwen3": lambda: Qwen3ForCausalLM(Qwen3Config(**SHAPE)),
}


def tiny(family: str):
    torch.manual_seed(0)
    model = FAMILIES[family]().eval()
    with torch.no_grad():  # random biases and norm weights, so that a misplaced one shows
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.2)
    return model


@pytest.mark.parametrize("family", list(FAMILIES))
@torch.inference_mode()
def test_prompt_logits_are_transformers(family: str) -> None:
    model = tiny(family)
    assert unsupported_reason(model) is None
    ids = torch.randint(0, 96, (21,), generator=torch.Generator().manual_seed(1))
    expected = model(input_ids=ids[None]).logits[0]
    for pack in (True, False):
        torch.testing.assert_close(score(Decoder(model, "fp32", pack=pack), ids), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@torch.inference_mode()
def test_decode_steps_on_the_paged_pool_are_transformers(family: str) -> None:
    model = tiny(family)
    runner = ModelRunner(model, num_blocks=16, block_size=4, decoder=Decoder(model, "fp32"))
    ids = torch.randint(0, 96, (13,), generator=torch.Generator().manual_seed(2)).tolist()
    session = Session(ids=ids[:10], block_table=[7, 3, 11, 5, 9, 2])  # scattered blocks
    req = Request(session=session, params=SamplingParams())
    runner.forward([ScheduledItem(req, 0, 10)])
    session.num_cached = 10
    for n in range(11, 14):  # the rest of the prompt one token at a time, as decodes
        session.ids = ids[:n]
        logits = runner.forward([ScheduledItem(req, n - 1, 1)])
        session.num_cached = n
        expected = model(input_ids=torch.tensor([ids[:n]])).logits[0, -1]
        torch.testing.assert_close(logits[0], expected, rtol=1e-4, atol=1e-4)


@torch.inference_mode()
def test_smoothing_folded_into_the_weights_leaves_the_function_unchanged() -> None:
    model = tiny("llama-biases")
    ids = torch.randint(0, 96, (30,), generator=torch.Generator().manual_seed(3))
    act_max = calibrate(model, ids)
    assert len(act_max) == 2 * 7 + 1  # every linear layer, the output projection too
    torch.testing.assert_close(score(Decoder(model, "fp32", act_max), ids), model(input_ids=ids[None]).logits[0],
                               rtol=1e-4, atol=1e-4)


def test_rotary_permutation_pairs_each_dimension_with_the_one_half_a_head_away() -> None:
    assert rotary_permutation(8).tolist() == [0, 4, 1, 5, 2, 6, 3, 7]


def test_a_model_the_decoder_cannot_run_keeps_its_own_modules_and_says_why(caplog) -> None:
    model = GPT2LMHeadModel(GPT2Config(vocab_size=96, n_embd=32, n_layer=1, n_head=2, n_positions=64))
    assert "gpt2" in unsupported_reason(model)
    with caplog.at_level(logging.WARNING, logger="voicepipe.llm.quality"):
        choice, decoder = choose_weights(model, tokenizer=None, requested="int8")
    assert decoder is None and choice.format == "fp32" and "gpt2" in choice.reason
    assert "llm.weights = int8 needs voicepipe's decoder" in caplog.text
