"""Codec registry: lookup by name, sizes, and round trips."""

import numpy as np
import pytest

from voicepipe.audio import decode_pcmu, encode_l16, get_codec

SAMPLES = np.array([0, 8, -8, 1000, -1000, 32124, -32124], dtype=np.int16)  # exact G.711 levels


@pytest.mark.parametrize(("name", "width"), [("pcmu", 1), ("pcma", 1), ("l16le", 2), ("l16be", 2)])
def test_each_codec_round_trips_with_its_width(name, width):
    codec = get_codec(name)
    assert codec.name == name
    data = codec.encode(SAMPLES)
    assert len(data) == width * len(SAMPLES) == codec.bytes_per_sample * len(SAMPLES)
    if name.startswith("l16"):
        np.testing.assert_array_equal(codec.decode(data), SAMPLES)
    else:
        decoded = codec.decode(data)
        np.testing.assert_array_equal(codec.decode(codec.encode(decoded)), decoded)


def test_codecs_are_wired_to_the_right_functions():
    assert get_codec("PCMU").decode(b"\x00")[0] == decode_pcmu(b"\x00")[0] == -32124
    assert get_codec("pcma").decode(b"\x2a")[0] == -32256
    assert get_codec("l16be").encode(SAMPLES) == encode_l16(SAMPLES, "big")
    assert get_codec("l16le").encode(SAMPLES) == encode_l16(SAMPLES, "little")


def test_unknown_codec_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown audio codec 'opus'.*pcma, pcmu"):
        get_codec("opus")
