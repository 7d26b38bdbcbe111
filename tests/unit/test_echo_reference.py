"""FarEndReference: what was playing at each input sample, across appends, barge-in clears and marks."""

from __future__ import annotations

import numpy as np
import pytest

from voicepipe.echo.reference import FarEndReference


def ramp(start: int, count: int) -> np.ndarray:
    """Samples whose values are their offsets in the sent stream plus one (0 is silence), so a window shows which
    ones played where."""
    return np.arange(start + 1, start + count + 1, dtype=np.float32)


def test_audio_plays_from_the_position_it_was_appended_at():
    ref = FarEndReference(rate=8000)
    assert ref.append(ramp(0, 4), at=10) == 10
    assert list(ref.window(8, 8)) == [0, 0, 1, 2, 3, 4, 0, 0]


def test_a_chunk_queues_after_the_previous_one_never_over_it():
    ref = FarEndReference(rate=8000)
    ref.append(ramp(0, 4), at=10)
    assert ref.append(ramp(4, 4), at=12) == 14  # the pacer's guess was early: playout is a queue
    assert ref.append(ramp(8, 2), at=20) == 20  # a gap in sending is a gap in playout
    assert list(ref.window(10, 12)) == [1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 9, 10]
    assert ref.end == 22


def test_clear_drops_what_had_not_played_and_keeps_what_had():
    ref = FarEndReference(rate=8000)
    ref.append(ramp(0, 6), at=0)
    ref.append(ramp(6, 6))
    assert ref.clear(at=4) == 8
    assert list(ref.window(0, 8)) == [1, 2, 3, 4, 0, 0, 0, 0]
    assert ref.append(ramp(12, 2), at=6) == 6  # the next reply plays after the barge-in, offsets go on
    assert list(ref.window(0, 8)) == [1, 2, 3, 4, 0, 0, 13, 14]


def test_a_late_mark_moves_the_rest_of_the_stream_and_leaves_silence():
    ref = FarEndReference(rate=8000)
    ref.append(ramp(0, 8), at=0)
    assert ref.mark(offset=4, at=7)  # sample 4 played at 7, not 4: the line held it 3 samples
    assert list(ref.window(0, 12)) == [1, 2, 3, 4, 0, 0, 0, 5, 6, 7, 8, 0]
    assert ref.append(ramp(8, 2)) == 11  # what comes next queues after the moved stream


def test_an_early_mark_pulls_the_stream_in_and_cuts_what_overlaps():
    ref = FarEndReference(rate=8000)
    ref.append(ramp(0, 4), at=0)
    ref.append(ramp(4, 4), at=6)
    assert ref.mark(offset=4, at=2)
    assert list(ref.window(0, 8)) == [1, 2, 5, 6, 7, 8, 0, 0]


def test_a_mark_for_audio_that_was_cleared_or_not_sent_moves_nothing():
    ref = FarEndReference(rate=8000)
    ref.append(ramp(0, 8), at=0)
    ref.clear(at=4)
    assert not ref.mark(offset=6, at=20)
    assert not ref.mark(offset=100, at=20)
    assert list(ref.window(0, 8)) == [1, 2, 3, 4, 0, 0, 0, 0]


def test_the_ring_forgets_the_oldest_audio_beyond_its_capacity():
    ref = FarEndReference(rate=10, capacity_s=1.0)  # 10 samples
    ref.append(ramp(0, 6), at=0)
    ref.append(ramp(6, 6))
    assert list(ref.window(0, 12)) == [0, 0, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    assert ref.mark(offset=2, at=2)
    assert not ref.mark(offset=1, at=1)


@pytest.mark.parametrize("start", [-5, 30])
def test_windows_outside_anything_played_are_silence(start):
    ref = FarEndReference(rate=8000)
    ref.append(ramp(0, 4), at=0)
    assert not ref.window(start, 5).any()
