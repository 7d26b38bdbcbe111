"""G.711 PCMU/PCMA against a plain scalar reference of the standard, over every int16 value."""

import numpy as np
import pytest

from voicepipe.audio import decode_pcma, decode_pcmu, encode_pcma, encode_pcmu

ALL_INT16 = np.arange(-32768, 32768, dtype=np.int16)
ALL_CODES = bytes(range(256))

# --- Reference: the textbook algorithms, one sample at a time -------------------------------------

SEG_END = [0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF, 0x3FFF, 0x7FFF]


def ref_linear2ulaw(pcm: int) -> int:
    """Sun g711.c linear2ulaw (16-bit input, bias 0x84; magnitudes above 32635 saturate)."""
    if pcm < 0:
        pcm = 0x84 - pcm
        mask = 0x7F
    else:
        pcm += 0x84
        mask = 0xFF
    seg = 0
    while seg < 8 and pcm > SEG_END[seg]:
        seg += 1
    if seg >= 8:
        return 0x7F ^ mask
    return ((seg << 4) | ((pcm >> (seg + 3)) & 0xF)) ^ mask


def ref_ulaw2linear(u: int) -> int:
    """Sun g711.c ulaw2linear."""
    u = ~u & 0xFF
    t = ((u & 0x0F) << 3) + 0x84
    t <<= (u & 0x70) >> 4
    return 0x84 - t if u & 0x80 else t - 0x84


def ref_linear2alaw(pcm: int) -> int:
    """ITU-T G.191 (STL) alaw_compress: 1's complement for negative values, even bits toggled."""
    ix = (~pcm if pcm < 0 else pcm) >> 4
    if ix > 15:
        iexp = 1
        while ix > 16 + 15:
            ix >>= 1
            iexp += 1
        ix -= 16
        ix += iexp << 4
    if pcm >= 0:
        ix |= 0x80
    return ix ^ 0x55


def ref_alaw2linear(a: int) -> int:
    """Sun g711.c alaw2linear."""
    a ^= 0x55
    t = (a & 0x0F) << 4
    seg = (a & 0x70) >> 4
    if seg == 0:
        t += 8
    elif seg == 1:
        t += 0x108
    else:
        t = (t + 0x108) << (seg - 1)
    return t if a & 0x80 else -t


@pytest.fixture(scope="module")
def reference() -> dict[str, np.ndarray]:
    values = [int(v) for v in ALL_INT16]
    return {
        "ulaw_codes": np.array([ref_linear2ulaw(v) for v in values], dtype=np.uint8),
        "alaw_codes": np.array([ref_linear2alaw(v) for v in values], dtype=np.uint8),
        "ulaw_levels": np.array([ref_ulaw2linear(c) for c in range(256)], dtype=np.int16),
        "alaw_levels": np.array([ref_alaw2linear(c) for c in range(256)], dtype=np.int16),
    }


# --- Exact agreement with the reference ------------------------------------------------------------


def test_pcmu_encode_matches_reference_for_every_int16(reference):
    codes = np.frombuffer(encode_pcmu(ALL_INT16), dtype=np.uint8)
    np.testing.assert_array_equal(codes, reference["ulaw_codes"])


def test_pcma_encode_matches_reference_for_every_int16(reference):
    codes = np.frombuffer(encode_pcma(ALL_INT16), dtype=np.uint8)
    np.testing.assert_array_equal(codes, reference["alaw_codes"])


def test_decode_matches_reference_for_every_code(reference):
    np.testing.assert_array_equal(decode_pcmu(ALL_CODES), reference["ulaw_levels"])
    np.testing.assert_array_equal(decode_pcma(ALL_CODES), reference["alaw_levels"])


def test_round_trip_levels_match_reference(reference):
    np.testing.assert_array_equal(
        decode_pcmu(encode_pcmu(ALL_INT16)), reference["ulaw_levels"][reference["ulaw_codes"]]
    )
    np.testing.assert_array_equal(
        decode_pcma(encode_pcma(ALL_INT16)), reference["alaw_levels"][reference["alaw_codes"]]
    )


# --- Known values of the standard ------------------------------------------------------------------

KNOWN_PCMU = {0xFF: 0, 0x7F: 0, 0x00: -32124, 0x80: 32124, 0xFE: 8, 0x7E: -8, 0xEF: 132, 0xDF: 396}
KNOWN_PCMA = {0xD5: 8, 0x55: -8, 0xAA: 32256, 0x2A: -32256, 0xD4: 24, 0xC5: 264, 0xF5: 528}


@pytest.mark.parametrize(("code", "level"), KNOWN_PCMU.items())
def test_pcmu_known_levels(code, level):
    assert ref_ulaw2linear(code) == level
    assert decode_pcmu(bytes([code]))[0] == level


@pytest.mark.parametrize(("code", "level"), KNOWN_PCMA.items())
def test_pcma_known_levels(code, level):
    assert ref_alaw2linear(code) == level
    assert decode_pcma(bytes([code]))[0] == level


def test_known_encodings():
    samples = np.array([0, 1, -1, 32767, -32768], dtype=np.int16)
    assert encode_pcmu(samples) == bytes([0xFF, 0xFF, 0x7F, 0x80, 0x00])
    assert encode_pcma(samples) == bytes([0xD5, 0xD5, 0x55, 0xAA, 0x2A])


# --- Quantization error bound ----------------------------------------------------------------------


def test_pcmu_round_trip_error_within_half_step():
    x = ALL_INT16[np.abs(ALL_INT16.astype(np.int32)) <= 32635]  # beyond that, mu-law saturates
    codes = np.frombuffer(encode_pcmu(x), dtype=np.uint8)
    step = 8 << ((~codes >> 4) & 0x7).astype(np.int32)
    error = np.abs(x.astype(np.int32) - decode_pcmu(codes.tobytes()))
    assert np.all(2 * error <= step)


def test_pcma_round_trip_error_within_half_step():
    x = ALL_INT16
    codes = np.frombuffer(encode_pcma(x), dtype=np.uint8)
    segment = ((codes ^ 0x55) >> 4) & 0x7
    step = 16 << np.maximum(segment.astype(np.int32) - 1, 0)
    error = np.abs(x.astype(np.int32) - decode_pcma(codes.tobytes()))
    assert np.all(2 * error <= step)


def test_decoded_levels_are_fixed_points():
    for encode, decode in ((encode_pcmu, decode_pcmu), (encode_pcma, decode_pcma)):
        levels = decode(ALL_CODES)
        np.testing.assert_array_equal(decode(encode(levels)), levels)


# --- Input handling --------------------------------------------------------------------------------


def test_strided_and_2d_input_encode_in_c_order():
    x = ALL_INT16[::7]
    assert encode_pcmu(x) == encode_pcmu(x.copy())
    stereo = ALL_INT16[:200].reshape(100, 2)
    assert encode_pcma(stereo) == encode_pcma(stereo.ravel())


@pytest.mark.parametrize("encode", [encode_pcmu, encode_pcma])
def test_encode_rejects_wrong_dtype(encode):
    with pytest.raises(TypeError, match="int16"):
        encode(np.zeros(4, dtype=np.float32))
    with pytest.raises(TypeError, match="int16"):
        encode([0, 1, 2])


@pytest.mark.parametrize(("encode", "decode"), [(encode_pcmu, decode_pcmu), (encode_pcma, decode_pcma)])
def test_empty_input_is_a_no_op(encode, decode):
    assert encode(np.zeros(0, dtype=np.int16)) == b""
    decoded = decode(b"")
    assert decoded.dtype == np.int16
    assert decoded.size == 0
