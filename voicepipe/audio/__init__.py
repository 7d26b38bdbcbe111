"""Audio core, pure numpy: G.711 and L16 codecs, resampling, 20 ms framing, bounded buffers."""

from voicepipe.audio.buffer import AudioBuffer
from voicepipe.audio.codecs import CODECS, Codec, get_codec
from voicepipe.audio.framing import Framer
from voicepipe.audio.g711 import decode_pcma, decode_pcmu, encode_pcma, encode_pcmu
from voicepipe.audio.l16 import decode_l16, encode_l16, float32_to_int16, int16_to_float32
from voicepipe.audio.resample import StreamResampler, resample

__all__ = [
    "CODECS",
    "AudioBuffer",
    "Codec",
    "Framer",
    "StreamResampler",
    "decode_l16",
    "decode_pcma",
    "decode_pcmu",
    "encode_l16",
    "encode_pcma",
    "encode_pcmu",
    "float32_to_int16",
    "get_codec",
    "int16_to_float32",
    "resample",
]
