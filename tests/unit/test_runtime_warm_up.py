"""The runtime's warm-up: the STT and the engine run once before the process takes its first call."""

from __future__ import annotations

import logging

import numpy as np

from voicepipe.config import Settings
from voicepipe.runtime import Runtime


class Transcriber:
    def __init__(self, fail: bool = False) -> None:
        self.heard: list[np.ndarray] = []
        self.fail = fail

    def transcribe(self, samples, sample_rate, timeout=None):
        if self.fail:
            raise RuntimeError("the STT worker is gone")
        self.heard.append(np.asarray(samples))
        return None


class Engine:
    def __init__(self) -> None:
        self.warmed = 0

    def warm_up(self) -> None:
        self.warmed += 1


def runtime(transcriber: Transcriber) -> Runtime:
    rt = Runtime(Settings())
    rt.transcriber = transcriber
    return rt


def test_the_stt_decodes_audio_it_does_not_skip_and_the_engine_warms_itself() -> None:
    stt, engine = Transcriber(), Engine()
    runtime(stt).warm_up(engine)
    (audio,) = stt.heard
    assert len(audio) == 16000 and float(np.sqrt(np.mean(audio ** 2))) > 1e-3  # the STT skips silence unheard
    assert engine.warmed == 1


def test_an_engine_without_a_warm_up_is_not_asked_and_a_failure_only_costs_the_first_call(caplog) -> None:
    runtime(Transcriber()).warm_up(object())  # a remote backend: its first request is its server's business
    with caplog.at_level(logging.ERROR):
        runtime(Transcriber(fail=True)).warm_up(Engine())
    assert "warming up the STT and the LLM failed" in caplog.text
