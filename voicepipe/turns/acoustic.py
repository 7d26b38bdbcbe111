"""Acoustic end-of-turn evidence: Smart Turn v3.2 hears whether the caller's speech sounds finished.

The model reads the last 8 s of 16 kHz mono audio (zeros on the left when there is less) as an 80x800
Whisper log-mel, the same features transformers' `WhisperFeatureExtractor(do_normalize=True)` makes, and
returns P(complete): near 1 when the speech so far sounds like a finished turn, near 0 mid-sentence.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
from faster_whisper.feature_extractor import FeatureExtractor

from voicepipe.errors import ModelError

RATE = 16000
WINDOW_S = 8
N_MELS = 80
HOP = 160
FRAMES = WINDOW_S * RATE // HOP  # 800
MODEL_FILE = "smart-turn-v3.2-cpu.onnx"
INPUT_NAME = "input_features"

# faster-whisper's extractor, with no extra end padding, matches Whisper's (n_fft 400, hop 160, 80 Slaney
# mels, periodic Hann, log10, max-8 floor, (x+4)/4) to within 1e-6. It keeps no state per call.
_EXTRACTOR = FeatureExtractor(feature_size=N_MELS, sampling_rate=RATE, hop_length=HOP,
                              chunk_length=WINDOW_S, n_fft=400)


def log_mel(audio_16k: np.ndarray) -> np.ndarray:
    """The model's input features, (80, 800) float32, from int16 or float mono audio at 16 kHz."""
    audio = _as_float(audio_16k)
    window = np.zeros(WINDOW_S * RATE, dtype=np.float32)
    tail = audio[-len(window):]  # the end of the turn is what the model judges
    if len(tail):
        window[len(window) - len(tail):] = tail
    # Whisper's do_normalize, over the padded window as transformers does it (scale-free, so int16 and float
    # audio give the same features).
    window = (window - window.mean()) / np.sqrt(window.var() + 1e-7)
    return _EXTRACTOR(window, padding=0).astype(np.float32, copy=False)


def _as_float(audio: np.ndarray) -> np.ndarray:
    audio = np.asarray(audio)
    if audio.ndim != 1:
        raise ValueError(f"Smart Turn takes mono audio as a 1-D array; got shape {audio.shape}.")
    if audio.dtype == np.int16:
        return audio.astype(np.float32) / 32768.0
    if not np.issubdtype(audio.dtype, np.floating):
        raise ValueError(f"Smart Turn takes int16 or float audio; got dtype {audio.dtype}.")
    audio = audio.astype(np.float32, copy=False)
    if not np.isfinite(audio).all():
        raise ValueError("Smart Turn audio holds NaN or infinite samples.")
    return audio


class SmartTurn:
    """One ONNX session over the Smart Turn model; `predict` may be called from any thread."""

    def __init__(self, session, path: Path) -> None:
        self._session = session
        self.path = path
        self.calls = 0  # predictions made
        self.seconds = 0.0  # total time in predict (features and inference)
        self._count_lock = threading.Lock()

    @classmethod
    def load(cls, path: Path, cpu_threads: int = 1) -> SmartTurn:
        """Load the model from its directory (or the .onnx file itself) on the CPU."""
        import onnxruntime as ort

        file = _model_file(Path(path))
        options = ort.SessionOptions()
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.inter_op_num_threads = 1
        options.intra_op_num_threads = cpu_threads
        try:
            session = ort.InferenceSession(str(file), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types for bad files
            detail = (str(exc).strip().splitlines() or [""])[0][:200]
            raise ModelError(f"could not load the turn model {file} ({exc.__class__.__name__}: {detail}).",
                             "delete it and run `voicepipe models fetch smart-turn-v3.2`.") from None
        _check_input(session, file)
        return cls(session, file)

    def predict(self, audio_16k: np.ndarray) -> float:
        """P(complete) for the speech so far (int16 or float mono at 16 kHz; only the last 8 s count)."""
        start = time.perf_counter()
        features = log_mel(audio_16k)[np.newaxis]
        output = self._session.run(None, {INPUT_NAME: features})[0]
        probability = float(np.asarray(output).reshape(-1)[0])  # the graph ends in a sigmoid already
        elapsed = time.perf_counter() - start
        with self._count_lock:
            self.calls += 1
            self.seconds += elapsed
        return probability


def _model_file(path: Path) -> Path:
    if path.is_dir():
        named = path / MODEL_FILE
        found = [named] if named.is_file() else sorted(path.glob("*.onnx"))
        if len(found) != 1:
            raise ModelError(f"turn model directory {path} holds {len(found)} .onnx files, not one.",
                             "point models.turn at the .onnx file, or run `voicepipe models fetch smart-turn-v3.2`.")
        return found[0]
    if not path.is_file():
        raise ModelError(f"turn model {path} does not exist.", "run `voicepipe models fetch smart-turn-v3.2`.")
    return path


def _check_input(session, file: Path) -> None:
    inputs = session.get_inputs()
    if len(inputs) == 1 and inputs[0].name == INPUT_NAME and _fits(list(inputs[0].shape)):
        return
    got = ", ".join(f"{i.name} {tuple(i.shape)}" for i in inputs) or "no input"
    raise ModelError(f"{file} is not a Smart Turn v3 model: it takes {got}, not {INPUT_NAME} (batch, {N_MELS}, "
                     f"{FRAMES}).", "set models.turn to smart-turn-v3.2 (`voicepipe models fetch smart-turn-v3.2`).")


def _fits(shape: list) -> bool:
    """(batch, 80, 800), where a dimension the graph leaves symbolic (a name, or None) fits anything."""
    if len(shape) != 3:
        return False
    return all(not isinstance(d, int) or d == want for d, want in zip(shape[1:], (N_MELS, FRAMES), strict=True))
