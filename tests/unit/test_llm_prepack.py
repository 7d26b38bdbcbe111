"""The oneDNN-packed linear layers: the same results as the plain ones, read from the packed copy for any number of
rows (a decode's single row too), the output projection included."""

from __future__ import annotations

import torch
from torch import nn

from voicepipe.llm.prepack import is_packed, prepack_linears


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(64, 160)
        self.down = nn.Linear(160, 64, bias=False)
        self.lm_head = nn.Linear(64, 1000, bias=False)

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.down(torch.relu(self.up(x))))


@torch.inference_mode()
def test_packed_linears_compute_what_the_plain_ones_do() -> None:
    torch.manual_seed(0)
    model = Tiny()
    inputs = [torch.randn(1, 1, 64), torch.randn(1, 19, 64), torch.randn(3, 64)]
    expected = [model(x) for x in inputs]
    assert prepack_linears(model) == 3
    assert is_packed(model.up) and is_packed(model.down) and is_packed(model.lm_head)
    assert prepack_linears(model) == 0  # packing again changes nothing
    for x, want in zip(inputs, expected, strict=True):
        got = model(x)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@torch.inference_mode()
def test_one_row_and_several_rows_read_the_packed_copy() -> None:
    torch.manual_seed(0)
    layer = nn.Linear(64, 96, bias=False)
    rows = torch.randn(5, 64)
    want = rows @ layer.weight.T
    holder = nn.Sequential(layer)
    assert prepack_linears(holder) == 1
    layer.weight.zero_()  # only the packed copy still holds the weights
    torch.testing.assert_close(layer(rows), want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(layer(rows[:1]), want[:1], rtol=1e-4, atol=1e-4)
