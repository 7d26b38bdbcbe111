"""L16 byte order round trips and float32 <-> int16 conversion."""

import struct

import numpy as np
import pytest

from voicepipe.audio import decode_l16, encode_l16, float32_to_int16, int16_to_float32

ALL_INT16 = np.arange(-32768, 32768, dtype=np.int16)


def test_known_bytes_in_both_orders():
    x = np.array([1, -2, 0x1234], dtype=np.int16)
    assert encode_l16(x) == struct.pack("<3h", 1, -2, 0x1234) == b"\x01\x00\xfe\xff\x34\x12"
    assert encode_l16(x, "big") == struct.pack(">3h", 1, -2, 0x1234) == b"\x00\x01\xff\xfe\x12\x34"
    np.testing.assert_array_equal(decode_l16(b"\x00\x01\xff\xfe\x12\x34", "big"), x)


@pytest.mark.parametrize("byteorder", ["little", "big"])
def test_every_int16_round_trips(byteorder):
    data = encode_l16(ALL_INT16, byteorder)
    assert len(data) == 2 * len(ALL_INT16)
    decoded = decode_l16(data, byteorder)
    assert decoded.dtype == np.dtype(np.int16)  # native order
    assert decoded.flags.writeable
    np.testing.assert_array_equal(decoded, ALL_INT16)


def test_orders_are_byte_swaps_of_each_other():
    little = encode_l16(ALL_INT16, "little")
    big = encode_l16(ALL_INT16, "big")
    assert little != big
    assert bytes(np.frombuffer(little, np.uint8).reshape(-1, 2)[:, ::-1].tobytes()) == big


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="even number of bytes"):
        decode_l16(b"\x00\x01\x02")
    with pytest.raises(ValueError, match="byteorder"):
        encode_l16(ALL_INT16, "middle")
    with pytest.raises(TypeError, match="int16"):
        encode_l16(np.zeros(4, dtype=np.int32))


def test_empty_is_a_no_op():
    assert encode_l16(np.zeros(0, dtype=np.int16)) == b""
    assert decode_l16(b"", "big").size == 0


def test_int16_float32_round_trip_is_exact():
    as_float = int16_to_float32(ALL_INT16)
    assert as_float.dtype == np.float32
    assert as_float.min() == -1.0
    assert as_float.max() < 1.0
    np.testing.assert_array_equal(float32_to_int16(as_float), ALL_INT16)


def test_float32_to_int16_clips_and_zeroes_nan():
    x = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 3.0, -3.0, np.nan, np.inf, -np.inf], dtype=np.float32)
    expected = [0, 16384, -16384, 32767, -32768, 32767, -32768, 0, 32767, -32768]
    np.testing.assert_array_equal(float32_to_int16(x), expected)


def test_float_conversion_rejects_wrong_dtype():
    with pytest.raises(TypeError, match="float32"):
        float32_to_int16(np.zeros(4, dtype=np.int16))
    with pytest.raises(TypeError, match="int16"):
        int16_to_float32(np.zeros(4, dtype=np.float32))
