"""The playback controller: real-time pacing with bounded lead, marks, generations, and the playout cursor."""

from __future__ import annotations

import numpy as np
import pytest

from voicepipe.transports.playback import Heard, MarkStatus, PlaybackController
from voicepipe.transports.serializers import ChunkPolicy

RATE = 8000


def ones(n: int) -> np.ndarray:
    return np.ones(n, dtype=np.int16)


def test_a_burst_of_200_ms_then_one_chunk_every_20_ms():
    c = PlaybackController(RATE)
    c.enqueue(ones(RATE), "reply")  # 1 s = 50 chunks of 20 ms
    assert len(c.poll(0.0)) == 10
    assert c.poll(0.0) == [] and c.poll(0.019) == []
    assert c.next_send_time(0.0) == pytest.approx(0.02)
    assert len(c.poll(0.02)) == 1
    assert c.lead(0.02) == pytest.approx(0.2)


def test_pacing_over_a_whole_reply_never_exceeds_the_lead():
    c = PlaybackController(RATE, max_lead_ms=200)
    c.enqueue(ones(RATE), "reply")
    sent_at: list[float] = []
    for step in range(401):  # a 5 ms event loop for 2 s
        now = step * 0.005
        for _chunk in c.poll(now):
            sent_at.append(now)
        assert c.lead(now) <= 0.2 + 1e-9
    assert len(sent_at) == 50
    for i, t in enumerate(sent_at):  # chunk i plays from i*20 ms; it may leave at most 200 ms early
        assert max(0.0, (i + 1) * 0.02 - 0.2) - 1e-9 <= t <= max(0.0, (i + 1) * 0.02 - 0.2) + 0.005
    assert sent_at[-1] == pytest.approx(0.8)
    assert c.is_playing(1.0)  # sent, but no mark has confirmed it
    assert c.on_mark("vp:0:49") is MarkStatus.PLAYED
    assert c.played_samples(1.0) == RATE and not c.is_playing(1.0)


def test_next_send_time_lets_a_caller_sleep_exactly():
    c = PlaybackController(RATE, max_lead_ms=60)
    assert c.next_send_time(0.0) is None
    c.enqueue(ones(RATE // 2), "x")
    now, sends = 0.0, 0
    while (due := c.next_send_time(now)) is not None:
        now = due
        released = c.poll(now)
        assert released, f"next_send_time said {due} but poll released nothing"
        sends += len(released)
    assert sends == 25 and now == pytest.approx(0.5 - 0.06)


def test_a_chunk_longer_than_the_lead_goes_only_when_the_line_is_idle():
    c = PlaybackController(RATE, ChunkPolicy(chunk=800), max_lead_ms=50)  # 100 ms chunks
    c.enqueue(ones(2400), "x")
    assert len(c.poll(0.0)) == 1
    assert c.poll(0.05) == [] and c.next_send_time(0.05) == pytest.approx(0.1)
    assert len(c.poll(0.1)) == 1


def test_every_chunk_gets_a_mark_and_marks_move_the_cursor():
    c = PlaybackController(RATE)
    c.enqueue(ones(800), "x")
    chunks = c.poll(0.0)
    assert [ch.mark for ch in chunks] == [f"vp:0:{i}" for i in range(5)]
    assert [(ch.start, ch.end) for ch in chunks] == [(i * 160, (i + 1) * 160) for i in range(5)]
    assert c.played_samples(10.0) == 0  # with marks, the clock alone proves nothing
    assert c.on_mark("vp:0:1") is MarkStatus.PLAYED and c.played_samples(0) == 320
    assert c.on_mark("vp:0:0") is MarkStatus.PLAYED and c.played_samples(0) == 320  # already covered
    assert c.on_mark("vp:0:4") is MarkStatus.PLAYED and c.played_samples(0) == 800
    for name in ("vp:0:9", "greeting-done", "vp:x:1", "vp:1:0", "xx:0:1", "vp:0"):
        assert c.on_mark(name) is MarkStatus.UNKNOWN, name
    assert c.played_samples(0) == 800 and not c.is_playing(0)


def test_providers_without_marks_send_none():
    c = PlaybackController(RATE, uses_marks=False)
    c.enqueue(ones(320), "x")
    assert [ch.mark for ch in c.poll(0.0)] == [None, None]


def test_marks_echoed_after_a_clear_are_discarded_not_heard():
    c = PlaybackController(RATE)
    c.enqueue(ones(1600), "first clause")
    c.enqueue(ones(1600), "second clause")
    c.end_of_audio()
    sent = c.poll(0.0)  # 200 ms of lead: the first clause
    assert len(sent) == 10 and {o for ch in sent for o in ch.origins} == {"first clause"}
    c.on_mark(sent[4].mark)  # 100 ms confirmed played
    result = c.clear(0.15)
    assert result.generation == c.generation == 1
    assert result.heard == [Heard("first clause", 800, 1600), Heard("second clause", 0, 1600)]
    assert result.dropped_samples == 2400
    for chunk in sent[5:]:  # Twilio echoes every pending mark on clear
        assert c.on_mark(chunk.mark) is MarkStatus.DISCARDED
    assert c.played_samples(1.0) == 0 and c.heard(1.0) == [] and not c.is_playing(1.0)
    assert c.poll(1.0) == []  # the second clause was dropped, not sent later

    c.enqueue(ones(320), "reply 2")
    fresh = c.poll(0.15)  # the provider flushed its buffer: no lead left from before
    assert [ch.mark for ch in fresh] == ["vp:1:0", "vp:1:1"]
    assert c.on_mark("vp:1:1") is MarkStatus.PLAYED
    assert c.heard(0.2) == [Heard("reply 2", 320, 320)]
    assert c.on_mark("vp:0:7") is MarkStatus.DISCARDED


def test_clock_cursor_without_marks_is_sample_accurate():
    c = PlaybackController(RATE, uses_marks=False)
    c.enqueue(ones(RATE), "a")
    c.poll(0.0)  # 1600 samples sent
    assert c.played_samples(0.0) == 0
    assert c.played_samples(0.05) == 400
    assert c.played_samples(0.2) == 1600
    assert c.played_samples(0.3) == 1600  # the clock never passes what was sent
    c.poll(0.3)  # a late poll: the next audio starts playing at 0.3, not 0.2
    assert c.played_samples(0.35) == 2000
    assert c.heard(0.35) == [Heard("a", 2000, RATE)]


def test_clear_on_a_provider_that_cannot_clear_counts_sent_audio_as_heard():
    c = PlaybackController(RATE, uses_marks=False, provider_clears=False)  # AudioSocket
    c.enqueue(ones(RATE), "a")
    c.poll(0.0)
    result = c.clear(0.05)
    assert result.heard == [Heard("a", 1600, RATE)] and result.dropped_samples == RATE - 1600
    c.enqueue(ones(160), "b")
    c.poll(0.05)
    assert c.played_samples(0.1) == 0  # still behind the 200 ms already in Asterisk
    assert c.played_samples(0.21) == 80


def test_clear_on_a_provider_that_clears_stops_the_clock_cursor_at_now():
    c = PlaybackController(RATE, uses_marks=False)
    c.enqueue(ones(RATE), "a")
    c.poll(0.0)
    assert c.clear(0.05).heard == [Heard("a", 400, RATE)]
    c.enqueue(ones(160), "b")
    c.poll(0.05)
    assert c.played_samples(0.06) == 80


def test_chunks_span_origins_and_the_tail_is_padded_by_policy():
    c = PlaybackController(RATE, ChunkPolicy(chunk=160, minimum=160, multiple=160))
    c.enqueue(ones(100), "a")
    c.enqueue(ones(100), "b")
    c.enqueue(ones(10), "c")
    c.end_of_audio()
    chunks = c.poll(0.0)
    assert [len(ch.audio) for ch in chunks] == [160, 160]
    assert [ch.origins for ch in chunks] == [("a", "b"), ("b", "c")]
    assert chunks[1].audio[50:].tolist() == [0] * 110  # silence pad after the last real sample
    c.on_mark(chunks[1].mark)
    assert [h.complete for h in c.heard(0.0)] == [True, True, True]


def test_release_heard_and_is_playing():
    c = PlaybackController(RATE, uses_marks=False)
    c.enqueue(ones(160), "a")
    c.enqueue(ones(160), "b")
    assert c.is_playing(0.0)
    c.poll(0.0)
    assert c.release_heard(0.03) == [Heard("a", 160, 160)]
    assert c.heard(0.03) == [Heard("b", 80, 160)]
    assert c.is_playing(0.03) and not c.is_playing(0.05)
    assert c.release_heard(0.05) == [Heard("b", 160, 160)] and c.heard(0.05) == []


def test_bad_arguments():
    c = PlaybackController(RATE)
    with pytest.raises(TypeError):
        c.enqueue(np.ones(10, dtype=np.float32))
    with pytest.raises(ValueError):
        c.enqueue(np.ones((10, 2), dtype=np.int16))
    c.enqueue(np.zeros(0, dtype=np.int16))
    assert c.next_send_time(0.0) is None
    with pytest.raises(ValueError):
        PlaybackController(0)
    with pytest.raises(ValueError):
        PlaybackController(RATE, mark_prefix="a:b")
    with pytest.raises(ValueError):
        ChunkPolicy(chunk=100, multiple=160)
