"""Fixtures for the speech rooms' end-to-end tests: the real VAD, STT and TTS models, and the spoken corpus."""

from __future__ import annotations

import pytest

from tests.speech_corpus import Corpus, build_corpora
from voicepipe.config import Settings
from voicepipe.llm.loader import load_causal_lm
from voicepipe.models import resolve_model
from voicepipe.stt import Transcriber
from voicepipe.stt.model import stt_placement
from voicepipe.tts import Synthesizer
from voicepipe.vad import SileroVAD


@pytest.fixture(scope="session")
def silero(settings: Settings) -> SileroVAD:
    return SileroVAD.load(resolve_model(settings.models.vad, "vad", settings.paths.models_dir))


@pytest.fixture(scope="session")
def transcriber(settings: Settings):
    device, compute, _ = stt_placement(settings)
    path = resolve_model(settings.models.stt, "stt", settings.paths.models_dir)
    stt = Transcriber.load(path, settings.stt, device, compute)
    yield stt
    stt.close()


@pytest.fixture(scope="session")
def synthesizer(settings: Settings):
    path = resolve_model(settings.models.tts, "tts", settings.paths.models_dir)
    synth = Synthesizer.load(path, settings.tts)
    yield synth
    synth.close()


@pytest.fixture(scope="session")
def corpora(synthesizer: Synthesizer) -> dict[str, Corpus]:
    """The espeak-ng and Piper corpora (built once, cached under tests/.generated/)."""
    return build_corpora(synthesizer.voice)


@pytest.fixture(scope="session")
def engine_model(settings: Settings):
    """(model, tokenizer) for the LLM engines under test; the engine registers its attention function on the
    model, so an oracle must load its own copy."""
    return load_causal_lm(resolve_model(settings.models.llm, "llm", settings.paths.models_dir), "cpu", "float32")


@pytest.fixture(scope="session")
def voice_dir(tmp_path_factory):
    """Where the call tests' espeak-ng caller utterances are written (one file per sentence)."""
    return tmp_path_factory.mktemp("caller")
