"""Load the Silero VAD ONNX model; one session is shared by all calls."""

from __future__ import annotations

from pathlib import Path


def load_silero(path: Path):
    import onnxruntime

    model_file = path if path.is_file() else next(path.glob("*.onnx"))
    options = onnxruntime.SessionOptions()
    options.inter_op_num_threads = 1
    options.intra_op_num_threads = 1
    return onnxruntime.InferenceSession(str(model_file), sess_options=options,
                                        providers=["CPUExecutionProvider"])
