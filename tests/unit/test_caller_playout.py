"""The caller simulator's playout clock: a phone line plays every frame after the one before; an RTP phone's
jitter buffer drains the backlog that a late burst leaves (caller/playout.py)."""

from __future__ import annotations

import numpy as np
import pytest

from voicepipe.caller.playout import ACCELERATE, JITTER_TARGET_S, Playout

RATE = 16000
FRAME = np.full(RATE // 50, 1000, np.int16)  # 20 ms of agent audio


def lateness_after_a_stall(playout: Playout, frames_after: int) -> tuple[list[float], int]:
    """Frames sent every 20 ms from t=0; the 10 of 0.2-0.4 s arrive at once at 0.4 s (a stalled sender catching
    up), the rest on time. Returns, per frame, how much later than its send time it started to play, and the
    samples played."""
    late, played = [], 0
    for k in range(20 + frames_after):
        sent = 0.02 * k
        arrived = 0.4 if 10 <= k < 20 else sent
        start, audio = playout.play(FRAME, arrived)
        late.append(start - sent)
        played += len(audio)
    return late, played


def test_a_phone_line_plays_every_frame_after_the_one_before_so_a_stall_makes_the_rest_late_for_good() -> None:
    late, played = lateness_after_a_stall(Playout(RATE), frames_after=50)
    assert played == 70 * len(FRAME)
    assert max(late[:10]) < 1e-9
    assert min(late[20:]) >= 0.2 - 1e-9  # the whole rest of the reply plays the stall's 200 ms late


def test_an_rtp_phones_jitter_buffer_drains_a_late_burst_back_to_its_level() -> None:
    late, played = lateness_after_a_stall(Playout(RATE, JITTER_TARGET_S), frames_after=50)
    assert max(late[:10]) < 1e-9
    assert late[10] >= 0.2 - 1e-9  # the buffer ran dry: the first frame of the burst plays late
    assert max(late[-20:]) <= JITTER_TARGET_S + 0.02  # ... and it caught up
    dropped = 70 * len(FRAME) - played
    assert 0 < dropped <= 0.2 * RATE + int(len(FRAME) * ACCELERATE)  # by playing faster, not by skipping audio


@pytest.mark.parametrize("jitter_s", [0.015, 0.06])
def test_an_rtp_phone_plays_a_stream_with_ordinary_jitter_whole(jitter_s: float) -> None:
    """Up to 60 ms: aiortc's receiver hands frames over up to 50 ms apart, and each frame cut would step the echo's
    alignment (caller/playout.py)."""
    playout = Playout(RATE, JITTER_TARGET_S)
    rng = np.random.default_rng(0)
    played = sum(len(playout.play(FRAME, 0.02 * k + rng.uniform(0, jitter_s))[1]) for k in range(500))
    assert played == 500 * len(FRAME)
