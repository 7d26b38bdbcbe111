"""Exotel outbound chunks: at least 100 ms, at most 100 kB, and a multiple of 320 bytes."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from voicepipe.transports.playback import PlaybackController
from voicepipe.transports.serializers import ExotelSerializer


def exotel(rate: int, **options) -> ExotelSerializer:
    serializer = ExotelSerializer(**options)
    start = {
        "event": "start",
        "sequence_number": "1",
        "stream_sid": "MZ1",
        "start": {
            "stream_sid": "MZ1",
            "call_sid": "CA1",
            "media_format": {"encoding": "audio/x-raw", "sample_rate": str(rate), "bit_rate": "16"},
        },
    }
    serializer.decode(json.dumps(start))
    return serializer


def payload_sizes(frames: list[str]) -> list[int]:
    return [len(base64.b64decode(json.loads(f)["media"]["payload"])) for f in frames]


def assert_valid(size: int, rate: int) -> None:
    assert size % 320 == 0, size
    assert size >= rate * 2 // 10, size  # 100 ms of 16-bit samples
    assert size <= 100_000, size


@pytest.mark.parametrize("rate", [8000, 16000, 24000])
def test_the_chunk_policy_is_valid_at_every_rate(rate):
    policy = exotel(rate).chunk_policy()
    assert policy.multiple == 160  # samples: 320 bytes
    assert policy.chunk * 2 == policy.minimum * 2 == rate * 2 // 10
    assert_valid(policy.chunk * 2, rate)


@pytest.mark.parametrize("rate", [8000, 16000, 24000])
@pytest.mark.parametrize("n", [1, 37, 160, 799, 800, 2401, 48_000])
def test_encode_pads_and_splits_to_valid_sizes(rate, n):
    serializer = exotel(rate)
    audio = np.arange(n, dtype=np.int16)
    frames = serializer.encode_audio(audio)
    sizes = payload_sizes(frames)
    for size in sizes:
        assert_valid(size, rate)
    pcm = np.frombuffer(b"".join(base64.b64decode(json.loads(f)["media"]["payload"]) for f in frames), dtype="<i2")
    np.testing.assert_array_equal(pcm[:n], audio)
    assert not pcm[n:].any()  # only silence was added
    assert len(pcm) - n < max(160, rate // 10)


def test_long_audio_is_split_under_100_kb():
    serializer = exotel(24000)
    frames = serializer.encode_audio(np.ones(24000 * 3, dtype=np.int16))  # 3 s = 144 kB
    sizes = payload_sizes(frames)
    assert len(sizes) == 2 and sum(sizes) == 144_000
    for size in sizes:
        assert_valid(size, 24000)


def test_the_playback_controller_cuts_valid_exotel_chunks():
    serializer = exotel(8000, chunk_ms=200)
    controller = PlaybackController(8000, serializer.chunk_policy(), max_lead_ms=400)
    controller.enqueue(np.ones(3333, dtype=np.int16), "reply")
    controller.end_of_audio()
    chunks = controller.poll(0.0)
    assert [len(c.audio) for c in chunks] == [1600, 1600]  # 400 ms of lead
    chunks += controller.poll(0.2)
    assert [len(c.audio) for c in chunks] == [1600, 1600, 800]  # then the tail, padded to 100 ms
    for chunk in chunks:
        [size] = payload_sizes(serializer.encode_audio(chunk.audio))
        assert_valid(size, 8000)


@pytest.mark.parametrize(("chunk_ms", "min_chunk_ms"), [(50, 50), (100, 80), (90, 100)])
def test_chunks_under_100_ms_are_refused(chunk_ms, min_chunk_ms):
    with pytest.raises(ValueError):
        ExotelSerializer(chunk_ms=chunk_ms, min_chunk_ms=min_chunk_ms)


def test_a_chunk_over_100_kb_is_refused():
    with pytest.raises(ValueError):
        exotel(24000, chunk_ms=3000).chunk_policy()
