"""Where the STT model runs: its CPU threads when `stt.cpu_threads` is 0."""

from __future__ import annotations

import pytest

from voicepipe.stt.model import auto_cpu_threads


@pytest.mark.parametrize(("cores", "threads"), [(1, 1), (2, 1), (4, 2), (8, 4), (64, 4)])
def test_the_stt_takes_half_the_cores_at_most_four(cores: int, threads: int) -> None:
    # on a 2-core machine the one decode thread leaves a core to the LLM, which waits for the decode
    assert auto_cpu_threads(cores) == threads
