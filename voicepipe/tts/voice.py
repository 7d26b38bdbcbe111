"""Load a Piper voice (``*.onnx`` with its ``*.onnx.json`` config) from a file or a directory."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from voicepipe.errors import ModelError


def find_voice_file(path: Path) -> Path:
    if path.is_file():
        return path
    voices = sorted(path.glob("*.onnx"))
    if not voices:
        raise ModelError(f"no Piper voice (*.onnx) in {path}.", "point models.tts at a Piper voice directory.")
    return voices[0]


# ordinary words for the warm-up clause: a reply's longest clause is this sort of text, cut at max_clause_chars
WARM_UP_WORDS = ("thank you for calling I have your booking for four people on Friday evening at half past seven and "
                 "the patio will be open if the weather holds so tell me which time suits you best")


def warm_up_text(chars: int) -> str:
    """``WARM_UP_WORDS``, repeated as needed, cut at the last word boundary within ``chars`` characters."""
    text = WARM_UP_WORDS
    while len(text) <= chars:
        text = f"{text} {WARM_UP_WORDS}"
    return text[:chars + 1].rsplit(" ", 1)[0]


def load_aligned_voice(path: Path, use_cuda: bool = False, cpu_threads: int = 0, warm_up_chars: int = 0):
    """The Piper voice with its phoneme alignment output patched in (needs the onnx package), on a session whose
    idle threads sleep instead of spinning: synthesis shares the CPU with the LLM engine and the STT, and spinning
    threads take cycles from them while they wait. ``cpu_threads`` 0 leaves the thread count to onnxruntime.

    The session plans no memory patterns. A pattern is one block for a whole run, planned per input shape and used
    from a shape's second run on; replies say clauses of the same lengths again and again, and those blocks
    fragmented the CPU arena until RSS grew by tens of MB a round. Allocated tensor by tensor, the memory the
    longest clause took serves every later clause, and synthesis is as fast. ``warm_up_chars`` > 0 synthesizes a
    clause that long once, so the arena reaches that size at load rather than during the first long reply (a
    clause of 200 characters takes ~175 MB); the calls' memory then stays flat (issue 25's soak)."""
    import onnx
    import onnxruntime
    from piper import PiperVoice
    from piper.config import PiperConfig
    from piper.patch_voice_with_alignment import add_alignment_output

    voice_file = find_voice_file(path)
    config = PiperConfig.from_dict(json.loads(Path(f"{voice_file}.json").read_text(encoding="utf-8")))
    model = onnx.load(str(voice_file))
    with contextlib.suppress(ValueError):  # already patched on disk
        add_alignment_output(model)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = cpu_threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.enable_mem_pattern = False
    providers = [("CUDAExecutionProvider", {"cudnn_conv_algo_search": "HEURISTIC"})] if use_cuda \
        else ["CPUExecutionProvider"]
    session = onnxruntime.InferenceSession(model.SerializeToString(), sess_options=options, providers=providers)
    voice = PiperVoice(session=session, config=config)
    if warm_up_chars:
        for _ in voice.synthesize(warm_up_text(warm_up_chars), include_alignments=True):
            pass
    return voice
