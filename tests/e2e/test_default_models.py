"""Each default model loads through the runtime's loaders and does its job."""

import numpy as np
import pytest
import torch

from voicepipe.audio import resample
from voicepipe.devices import llm_dtype_name, stt_compute_type
from voicepipe.llm.loader import load_causal_lm
from voicepipe.models import resolve_model
from voicepipe.stt.model import load_whisper
from voicepipe.tts import load_aligned_voice
from voicepipe.vad.model import load_silero

pytestmark = pytest.mark.e2e

SENTENCE = "I would like to book a table for four people tonight."


@pytest.fixture(scope="module")
def piper_audio(settings):
    voice = load_aligned_voice(resolve_model(settings.models.tts, "tts", settings.paths.models_dir))
    chunks = list(voice.synthesize(SENTENCE))
    rate = chunks[0].sample_rate
    return np.concatenate([c.audio_int16_array for c in chunks]), rate


def test_tts_produces_speech_audio(piper_audio):
    audio, rate = piper_audio
    assert rate == 22050
    seconds = len(audio) / rate
    assert 2.0 < seconds < 8.0
    rms = np.sqrt(np.mean(audio.astype(np.float64) ** 2))
    assert rms > 500  # audible speech, not silence


def test_stt_transcribes_a_piper_sentence(settings, piper_audio):
    audio, rate = piper_audio
    model = load_whisper(resolve_model(settings.models.stt, "stt", settings.paths.models_dir), "cpu",
                         stt_compute_type(settings.device))
    audio16k = resample(audio, rate, 16000).astype(np.float32) / 32768.0
    segments, _ = model.transcribe(audio16k, language="en", beam_size=1)
    text = " ".join(s.text for s in segments).lower()
    assert text.strip(" .") == SENTENCE.lower().strip(" ."), text


def test_llm_generates_text(settings):
    path = resolve_model(settings.models.llm, "llm", settings.paths.models_dir)
    model, tokenizer = load_causal_lm(path, "cpu", llm_dtype_name(settings.device))
    assert next(model.parameters()).dtype == torch.float32
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                        add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    reply = tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in reply


def _speech_probabilities(session, audio16k: np.ndarray) -> np.ndarray:
    """Silero v6 on 512-sample windows, each preceded by 64 samples of context, state carried along."""
    windows = audio16k[: len(audio16k) // 512 * 512].reshape(-1, 512)
    context = np.vstack([np.zeros((1, 64), np.float32), windows[:-1, -64:]])
    state = np.zeros((1, 1, 128), np.float32)
    out, _, _ = session.run(None, {"input": np.hstack([context, windows]), "h": state, "c": state})
    return out.reshape(-1)


def test_vad_model_scores_speech_above_silence(settings, piper_audio):
    session = load_silero(resolve_model(settings.models.vad, "vad", settings.paths.models_dir))
    audio, rate = piper_audio
    speech = resample(audio, rate, 16000).astype(np.float32) / 32768.0
    assert _speech_probabilities(session, speech).max() > 0.8
    assert _speech_probabilities(session, np.zeros(16000, np.float32)).max() < 0.2
