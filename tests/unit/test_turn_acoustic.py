"""Smart Turn's features and loader without the real model, and the runtime's rule for a missing turn model."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from voicepipe.config import load_settings
from voicepipe.errors import ModelError
from voicepipe.runtime import Runtime
from voicepipe.turns.acoustic import SmartTurn, log_mel

RATE = 16000


def speechlike(seconds: float, seed: int = 0) -> np.ndarray:
    """Noise shaped by a slow envelope: enough structure that a shift or a crop changes the features."""
    n = round(seconds * RATE)
    rng = np.random.default_rng(seed)
    envelope = 0.5 + 0.5 * np.sin(np.arange(n) / 700.0)
    return (rng.normal(0, 0.1, n) * envelope).astype(np.float32)


def test_features_have_the_models_shape_and_dtype() -> None:
    for seconds in (0.5, 8.0, 11.0):
        features = log_mel(speechlike(seconds))
        assert features.shape == (80, 800) and features.dtype == np.float32
        assert np.isfinite(features).all()


def test_longer_audio_keeps_its_last_8_seconds() -> None:
    end = speechlike(8.0, seed=1)
    a = np.concatenate([speechlike(3.0, seed=2), end])
    b = np.concatenate([np.zeros(RATE, np.float32), end])
    np.testing.assert_array_equal(log_mel(a), log_mel(b))
    np.testing.assert_array_equal(log_mel(a), log_mel(end))
    assert not np.allclose(log_mel(a), log_mel(np.concatenate([end, speechlike(0.5, seed=3)])))


def test_shorter_audio_is_padded_on_the_left() -> None:
    clip = speechlike(1.0)
    features = log_mel(clip)
    np.testing.assert_array_equal(features, log_mel(np.concatenate([np.zeros(7 * RATE, np.float32), clip])))
    # The padding is the first 7 s (700 frames): every frame there is the same, the speech is at the end.
    padding = features[:, :695]
    assert np.all(padding == padding[:, :1])
    assert np.abs(features[:, -90:] - padding[:, :1]).max() > 1.0
    assert not np.allclose(features, log_mel(np.concatenate([clip, np.zeros(7 * RATE, np.float32)])))


def test_int16_and_float_audio_give_the_same_features() -> None:
    as_int16 = np.round(speechlike(2.0) * 32767).astype(np.int16)
    as_float = as_int16.astype(np.float32) / 32768.0
    np.testing.assert_allclose(log_mel(as_int16), log_mel(as_float), atol=1e-5)
    np.testing.assert_allclose(log_mel(as_float.astype(np.float64)), log_mel(as_float), atol=1e-5)


def test_bad_audio_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match="1-D array; got shape"):
        log_mel(np.zeros((2, RATE), np.float32))
    broken = speechlike(1.0)
    broken[100] = np.nan
    with pytest.raises(ValueError, match="NaN or infinite"):
        log_mel(broken)
    with pytest.raises(ValueError, match="int16 or float audio; got dtype int32"):
        log_mel(np.zeros(RATE, np.int32))


def tiny_model(path, name: str = "input_features", shape: tuple = ("batch", 80, 800)):
    """An ONNX graph with Smart Turn's interface (one float input, a sigmoid out): sigmoid(mean of the input)."""
    x = helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)
    nodes = [helper.make_node("ReduceMean", [name], ["m"], keepdims=1),
             helper.make_node("Sigmoid", ["m"], ["logits"])]
    model = helper.make_model(helper.make_graph(nodes, "tiny-turn", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_predict_runs_the_session_and_counts(tmp_path) -> None:
    tiny_model(tmp_path / "smart-turn-v3.2-cpu.onnx")
    turn = SmartTurn.load(tmp_path)  # the model directory, as resolve_model gives it
    audio = speechlike(2.0)
    p = turn.predict(audio)
    assert p == pytest.approx(1 / (1 + np.exp(-log_mel(audio).mean())), abs=1e-6)
    assert turn.predict(np.round(audio * 32767).astype(np.int16)) == pytest.approx(p, abs=1e-5)
    assert turn.calls == 2 and turn.seconds > 0


def test_load_refuses_a_model_with_another_input(tmp_path) -> None:
    with pytest.raises(ModelError, match=r"not a Smart Turn v3 model: it takes audio \(1, 16000\)"):
        SmartTurn.load(tiny_model(tmp_path / "a.onnx", name="audio", shape=(1, 16000)))
    with pytest.raises(ModelError, match=r"it takes input_features \('batch', 128, 3000\)"):
        SmartTurn.load(tiny_model(tmp_path / "b.onnx", shape=("batch", 128, 3000)))
    with pytest.raises(ModelError, match="does not exist"):
        SmartTurn.load(tmp_path / "missing.onnx")
    (tmp_path / "c.onnx").write_bytes(b"not an onnx file")
    with pytest.raises(ModelError, match="could not load the turn model"):
        SmartTurn.load(tmp_path / "c.onnx")


def runtime_without_turn_model(tmp_path, **turn) -> Runtime:
    """The other four models point at an existing directory (resolve_model accepts any local path); the
    models directory is empty, so the default turn model is missing."""
    other = {kind: str(tmp_path) for kind in ("vad", "stt", "tts", "llm")}
    (tmp_path / "models").mkdir()
    settings = load_settings(overrides={"models": other, "paths": {"models_dir": str(tmp_path / "models")},
                                        "turn": turn})
    return Runtime(settings)


@pytest.mark.parametrize("policy", ["hybrid", "text"])  # "on" loads it for calls that pick hybrid, whatever the default
def test_acoustic_on_refuses_a_missing_turn_model(tmp_path, policy) -> None:
    runtime = runtime_without_turn_model(tmp_path, acoustic="on", policy=policy)
    with pytest.raises(ModelError) as info:
        runtime.model_paths()
    line = str(info.value)
    assert "turn model 'smart-turn-v3.2'" in line and "voicepipe models fetch smart-turn-v3.2" in line
    assert "\n" not in line


def test_acoustic_auto_warns_once_and_goes_on(tmp_path, caplog) -> None:
    runtime = runtime_without_turn_model(tmp_path, acoustic="auto", policy="acoustic")
    with caplog.at_level(logging.WARNING, logger="voicepipe.runtime"):
        assert "turn" not in runtime.model_paths()
        assert "turn" not in runtime.model_paths()  # serve checks, then the load resolves again
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "voicepipe models fetch smart-turn-v3.2" in warnings[0] and "text evidence alone" in warnings[0]
    assert runtime.turn is None


@pytest.mark.parametrize("turn", [{"acoustic": "off", "policy": "hybrid"}, {"acoustic": "auto", "policy": "text"},
                                  {"acoustic": "auto", "policy": "silence"}])
def test_turn_model_not_needed_is_not_looked_for(tmp_path, caplog, turn) -> None:
    runtime = runtime_without_turn_model(tmp_path, **turn)
    with caplog.at_level(logging.WARNING, logger="voicepipe.runtime"):
        assert set(runtime.model_paths()) == {"vad", "stt", "tts", "llm"}
    assert not caplog.records


def test_a_present_turn_model_is_resolved(tmp_path) -> None:
    runtime = runtime_without_turn_model(tmp_path, acoustic="auto", policy="hybrid")
    model_dir = tmp_path / "models" / "smart-turn-v3.2"
    model_dir.mkdir()
    (model_dir / "smart-turn-v3.2-cpu.onnx").write_bytes(b"")  # load time checks presence only
    assert runtime.model_paths()["turn"] == model_dir
