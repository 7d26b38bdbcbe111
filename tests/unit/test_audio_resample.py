"""Resampling: tones keep pitch and level, 20 ms streaming equals one-shot resampling, and no audio is held back."""

from itertools import pairwise

import numpy as np
import pytest

from voicepipe.audio import StreamResampler, float32_to_int16, int16_to_float32, resample

EDGE_S = 0.05  # filter transients at each end are ignored


def tone(rate: int, seconds: float = 1.0, freq: float = 1000.0, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def as_float(x: np.ndarray) -> np.ndarray:
    return int16_to_float32(x) if x.dtype == np.int16 else x


def trimmed(x: np.ndarray, rate: int) -> np.ndarray:
    edge = int(EDGE_S * rate)
    return as_float(x)[edge:-edge].astype(np.float64)


def peak_frequency(x: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spectrum) * rate / len(x))


def rms_db(x: np.ndarray) -> float:
    return float(20 * np.log10(np.sqrt(np.mean(x**2))))


def stream(resampler: StreamResampler, x: np.ndarray, chunk: int) -> np.ndarray:
    outs = [resampler.process(x[i : i + chunk]) for i in range(0, len(x), chunk)]
    return np.concatenate([*outs, resampler.flush()])


@pytest.mark.parametrize("dtype", [np.float32, np.int16])
def test_tone_keeps_frequency_and_level_through_rate_chain(dtype):
    x = tone(8000)
    if dtype == np.int16:
        x = float32_to_int16(x)
    reference_db = rms_db(trimmed(x, 8000))
    for in_rate, out_rate in pairwise([8000, 16000, 48000, 8000]):
        x = stream(StreamResampler(in_rate, out_rate, dtype=dtype), x, chunk=in_rate // 50)
        assert x.dtype == dtype
        assert len(x) == out_rate  # one second in, one second out
        y = trimmed(x, out_rate)
        assert peak_frequency(y, out_rate) == pytest.approx(1000.0, rel=0.01)
        assert abs(rms_db(y) - reference_db) < 1.0


@pytest.mark.parametrize(
    ("in_rate", "out_rate"), [(8000, 16000), (16000, 8000), (48000, 8000), (8000, 48000), (22050, 16000)]
)
def test_streaming_in_20ms_chunks_matches_one_shot(in_rate, out_rate):
    rng = np.random.default_rng(1)
    x = np.clip(tone(in_rate, freq=440.0) + 0.1 * rng.standard_normal(in_rate), -1, 1).astype(np.float32)
    streamed = stream(StreamResampler(in_rate, out_rate, dtype=np.float32), x, chunk=in_rate // 50)
    one_shot = resample(x, in_rate, out_rate)
    assert len(streamed) == len(one_shot)
    assert np.sqrt(np.mean((streamed - one_shot) ** 2)) < 1e-3


def test_int16_streaming_matches_one_shot():
    x = float32_to_int16(tone(16000, freq=700.0, amplitude=0.9))
    streamed = stream(StreamResampler(16000, 8000), x, chunk=320)
    one_shot = resample(x, 16000, 8000)
    assert streamed.dtype == one_shot.dtype == np.int16
    assert np.sqrt(np.mean((as_float(streamed) - as_float(one_shot)) ** 2)) < 1e-3


def test_stereo_channels_are_resampled_independently():
    left, right = tone(8000, freq=500.0), tone(8000, freq=1500.0)
    stereo = np.stack([left, right], axis=1)
    out = stream(StreamResampler(8000, 16000, channels=2, dtype=np.float32), stereo, chunk=160)
    assert out.shape == (16000, 2)
    np.testing.assert_allclose(out[:, 0], resample(left, 8000, 16000), atol=1e-5)
    np.testing.assert_allclose(out[:, 1], resample(right, 8000, 16000), atol=1e-5)


def test_flush_resets_the_stream_for_reuse():
    x = tone(8000)
    resampler = StreamResampler(8000, 16000, dtype=np.float32)
    first = stream(resampler, x, chunk=160)
    second = stream(resampler, x, chunk=160)
    np.testing.assert_array_equal(first, second)


def test_equal_rates_pass_through():
    x = float32_to_int16(tone(16000))
    resampler = StreamResampler(16000, 16000)
    assert resampler.process(x) is x
    assert len(resampler.flush()) == 0
    np.testing.assert_array_equal(resample(x, 16000, 16000), x)


def test_empty_chunk_is_a_no_op():
    resampler = StreamResampler(8000, 16000)
    out = resampler.process(np.zeros(0, dtype=np.int16))
    assert out.dtype == np.int16
    assert out.size == 0
    assert resample(np.zeros(0, dtype=np.float32), 8000, 16000).size == 0


def test_bad_input_is_rejected():
    resampler = StreamResampler(8000, 16000)
    with pytest.raises(TypeError, match="int16"):
        resampler.process(np.zeros(160, dtype=np.float32))
    with pytest.raises(ValueError, match="shape"):
        resampler.process(np.zeros((160, 2), dtype=np.int16))
    with pytest.raises(TypeError):
        StreamResampler(8000, 16000, dtype=np.float64)
    with pytest.raises(ValueError):
        StreamResampler(0, 16000)
    with pytest.raises(TypeError):
        resample(np.zeros(10, dtype=np.int32), 8000, 16000)


@pytest.mark.parametrize(("in_rate", "out_rate"), [(8000, 16000), (16000, 8000), (22050, 8000), (48000, 16000)])
def test_each_20ms_chunk_comes_out_at_once(in_rate, out_rate):
    """A call's VAD must see each caller frame as it arrives: at most a few samples are held back, never a block."""
    resampler = StreamResampler(in_rate, out_rate)
    frame, expected = in_rate // 50, out_rate // 50
    x = float32_to_int16(tone(in_rate))
    sizes = [len(resampler.process(x[i: i + frame])) for i in range(0, len(x), frame)]
    assert all(expected - 40 <= n <= expected + 40 for n in sizes), sizes
