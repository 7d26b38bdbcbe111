"""AudioBuffer: bounded FIFO that drops the oldest samples and counts them."""

import numpy as np
import pytest

from voicepipe.audio import AudioBuffer


def test_capacity_from_duration():
    assert AudioBuffer(8000, 0.1).capacity == 800
    assert AudioBuffer(16000, 2.0).capacity == 32000


def test_fifo_order_below_capacity():
    buf = AudioBuffer(8000, 0.1)
    buf.append(np.arange(100, dtype=np.int16))
    buf.append(np.arange(100, 150, dtype=np.int16))
    assert len(buf) == 150
    np.testing.assert_array_equal(buf.read(120), np.arange(120))
    np.testing.assert_array_equal(buf.read(1000), np.arange(120, 150))
    assert len(buf) == 0
    assert buf.dropped == 0


def test_overflow_drops_oldest_and_counts():
    buf = AudioBuffer(8000, 0.1)
    x = np.arange(1000, dtype=np.int16)
    buf.append(x[:500])
    buf.append(x[500:])
    assert len(buf) == 800
    assert buf.dropped == 200
    np.testing.assert_array_equal(buf.read(800), x[200:])


def test_chunk_larger_than_capacity_keeps_its_tail():
    buf = AudioBuffer(1000, 0.01)  # 10 samples
    buf.append(np.arange(3, dtype=np.int16))
    buf.append(np.arange(100, 125, dtype=np.int16))
    assert buf.dropped == 18
    np.testing.assert_array_equal(buf.read(10), np.arange(115, 125))


def test_matches_a_plain_list_model_across_wraparound():
    rng = np.random.default_rng(7)
    buf = AudioBuffer(1000, 0.05)  # 50 samples
    model: list[int] = []
    dropped = 0
    counter = 0
    for _ in range(500):
        if rng.random() < 0.6:
            n = int(rng.integers(0, 80))
            chunk = np.arange(counter, counter + n, dtype=np.int16)
            counter += n
            buf.append(chunk)
            model += chunk.tolist()
            dropped += max(0, len(model) - 50)
            model = model[-50:] if model else model
        else:
            n = int(rng.integers(0, 60))
            assert buf.read(n).tolist() == model[:n]
            model = model[n:]
        assert len(buf) == len(model)
        assert buf.dropped == dropped


def test_clear_and_edge_reads():
    buf = AudioBuffer(8000, 0.1)
    buf.append(np.ones(900, dtype=np.int16))
    buf.clear()
    assert len(buf) == 0
    assert buf.dropped == 100
    assert buf.read(10).size == 0
    buf.append(np.zeros(0, dtype=np.int16))
    assert len(buf) == 0
    with pytest.raises(ValueError):
        buf.read(-1)


def test_float32_buffer_and_bad_input():
    buf = AudioBuffer(16000, 0.5, dtype=np.float32)
    buf.append(np.full(10, 0.5, dtype=np.float32))
    assert buf.read(10).dtype == np.float32
    with pytest.raises(TypeError, match="float32"):
        buf.append(np.zeros(10, dtype=np.int16))
    with pytest.raises(ValueError, match="1-D"):
        buf.append(np.zeros((10, 2), dtype=np.float32))
    with pytest.raises(ValueError):
        AudioBuffer(8000, 0.0)


def test_latest_copies_the_newest_samples_across_the_wrap_without_removing_them():
    buf = AudioBuffer(10, 1.0)  # 10 samples
    buf.append(np.arange(8, dtype=np.int16))
    buf.append(np.arange(8, 14, dtype=np.int16))  # wraps: holds 4..13
    assert buf.latest(3).tolist() == [11, 12, 13]
    assert buf.latest(100).tolist() == list(range(4, 14))
    assert buf.latest(0).tolist() == []
    assert len(buf) == 10 and buf.read(2).tolist() == [4, 5]
