"""Framer: arbitrary chunk sizes become exact 20 ms frames, with the remainder carried over."""

import numpy as np
import pytest

from voicepipe.audio import Framer

ODD_SIZES = [1, 7, 159, 161, 333, 0, 160, 1000, 3]


@pytest.mark.parametrize(("rate", "frame_size"), [(8000, 160), (16000, 320), (48000, 960)])
def test_odd_chunks_carry_over(rate, frame_size):
    framer = Framer(rate)
    assert framer.frame_size == frame_size
    x = np.arange(sum(ODD_SIZES), dtype=np.int16)
    frames: list[np.ndarray] = []
    fed = 0
    for size in ODD_SIZES:
        new = framer.push(x[fed : fed + size])
        fed += size
        assert all(len(f) == frame_size for f in new)
        frames += new
        assert len(frames) == fed // frame_size
        assert framer.pending == fed % frame_size
        if frames:
            np.testing.assert_array_equal(np.concatenate(frames), x[: len(frames) * frame_size])


def test_flush_pads_the_remainder_to_a_full_frame():
    framer = Framer(8000)
    x = np.arange(1, 201, dtype=np.int16)
    (frame,) = framer.push(x)
    np.testing.assert_array_equal(frame, x[:160])
    (last,) = framer.flush()
    assert len(last) == 160
    np.testing.assert_array_equal(last[:40], x[160:])
    assert not last[40:].any()
    assert framer.pending == 0
    assert framer.flush() == []


def test_flush_without_pad_returns_the_raw_remainder():
    framer = Framer(16000, frame_ms=10, dtype=np.float32)
    x = np.linspace(-1, 1, 250, dtype=np.float32)
    framer.push(x)
    (last,) = framer.flush(pad=False)
    np.testing.assert_array_equal(last, x[160:])
    assert last.dtype == np.float32


def test_frames_do_not_alias_the_input():
    framer = Framer(8000)
    x = np.ones(320, dtype=np.int16)
    frames = framer.push(x)
    x[:] = 0
    assert all(f.all() for f in frames)


def test_empty_chunk_is_a_no_op():
    framer = Framer(8000)
    framer.push(np.ones(10, dtype=np.int16))
    assert framer.push(np.zeros(0, dtype=np.int16)) == []
    assert framer.pending == 10


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="whole number"):
        Framer(11025)  # 20 ms is 220.5 samples
    framer = Framer(8000)
    with pytest.raises(TypeError, match="int16"):
        framer.push(np.zeros(160, dtype=np.float32))
    with pytest.raises(ValueError, match="1-D"):
        framer.push(np.zeros((160, 2), dtype=np.int16))
