"""Wire codecs by name ("pcmu", "pcma", "l16le", "l16be"), so transports can pick one from config."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np

from voicepipe.audio.g711 import decode_pcma, decode_pcmu, encode_pcma, encode_pcmu
from voicepipe.audio.l16 import decode_l16, encode_l16


@dataclass(frozen=True)
class Codec:
    """A codec: int16 samples -> bytes, bytes -> int16 samples, and its size on the wire."""

    name: str
    encode: Callable[[np.ndarray], bytes]
    decode: Callable[[bytes], np.ndarray]
    bytes_per_sample: int


CODECS: dict[str, Codec] = {
    codec.name: codec
    for codec in (
        Codec("pcmu", encode_pcmu, decode_pcmu, 1),
        Codec("pcma", encode_pcma, decode_pcma, 1),
        Codec("l16le", partial(encode_l16, byteorder="little"), partial(decode_l16, byteorder="little"), 2),
        Codec("l16be", partial(encode_l16, byteorder="big"), partial(decode_l16, byteorder="big"), 2),
    )
}


def get_codec(name: str) -> Codec:
    """Look up a codec by name (case-insensitive); unknown names raise ValueError."""
    try:
        return CODECS[name.lower()]
    except KeyError:
        known = ", ".join(sorted(CODECS))
        raise ValueError(f"unknown audio codec {name!r}; expected one of: {known}") from None
