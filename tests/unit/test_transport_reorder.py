"""Telnyx frames may arrive out of order: media is re-ordered by sequence_number in a small buffer."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from voicepipe.audio import encode_pcmu
from voicepipe.transports.events import Dtmf, Mark, Media, Stop
from voicepipe.transports.reorder import ReorderBuffer
from voicepipe.transports.serializers import TelnyxSerializer, TwilioSerializer


def test_in_order_items_pass_straight_through():
    buf = ReorderBuffer(window=3)
    assert [buf.push(i, i) for i in range(5)] == [[0], [1], [2], [3], [4]]


def test_a_swapped_pair_comes_out_in_order():
    buf = ReorderBuffer(window=3)
    buf.reset(1)
    assert buf.push(2, "b") == []
    assert len(buf) == 1
    assert buf.push(1, "a") == ["a", "b"]
    assert buf.push(3, "c") == ["c"]


def test_a_gap_is_given_up_once_the_window_is_full():
    buf = ReorderBuffer(window=2)
    buf.reset(1)
    assert buf.push(2, "b") == [] and buf.push(3, "c") == []
    assert buf.push(4, "d") == ["b", "c", "d"]  # 1 never came: skipped
    assert buf.skipped == 1
    assert buf.push(1, "a") == [] and buf.late == 1  # too late now, dropped


def test_duplicates_are_dropped():
    buf = ReorderBuffer(window=3)
    assert buf.push(5, "x") == ["x"]
    assert buf.push(5, "x") == [] and buf.late == 1
    assert buf.push(7, "z") == [] and buf.push(7, "z") == []
    assert buf.push(6, "y") == ["y", "z"]


def test_skipped_numbers_do_not_block_and_drain_flushes():
    buf = ReorderBuffer(window=5)
    buf.reset(1)
    assert buf.push(3, "c") == []
    assert buf.skip(1) == []  # a non-media message took number 1
    assert buf.push(2, "b") == ["b", "c"]
    assert buf.push(6, "f") == [] and buf.push(5, "e") == []
    assert buf.drain() == ["e", "f"]
    assert buf.push(7, "g") == ["g"]


def test_window_must_be_positive():
    with pytest.raises(ValueError):
        ReorderBuffer(window=0)


START = {
    "event": "start",
    "sequence_number": "1",
    "stream_id": "s-1",
    "start": {"call_control_id": "c-1", "media_format": {"encoding": "PCMU", "sample_rate": 8000, "channels": 1}},
}


def media(seq: int, value: int) -> str:
    payload = base64.b64encode(encode_pcmu(np.full(160, value, dtype=np.int16))).decode()
    body = {"track": "inbound", "chunk": str(seq - 1), "timestamp": str(20 * (seq - 2)), "payload": payload}
    return json.dumps({"event": "media", "sequence_number": str(seq), "stream_id": "s-1", "media": body})


def control(seq: int, event: str) -> str:
    body = {"mark": {"name": f"m{seq}"}} if event == "mark" else {"dtmf": {"digit": "3"}} if event == "dtmf" else {}
    return json.dumps({"event": event, "sequence_number": str(seq), "stream_id": "s-1", **body})


def run(serializer, frames: list[str]) -> list:
    events = []
    for frame in frames:
        events.extend(serializer.decode(frame))
    return events


LEVELS = {2: 1000, 3: 2000, 4: 3000, 5: 4000, 6: 5000}


def level(event: Media) -> int:
    return int(round(float(event.audio.mean()), -3))


def test_telnyx_reorders_shuffled_media_by_sequence_number():
    serializer = TelnyxSerializer()
    events = run(serializer, [json.dumps(START), *(media(s, LEVELS[s]) for s in (3, 2, 5, 4, 6))])
    media_events = [e for e in events if isinstance(e, Media)]
    assert [e.sequence for e in media_events] == [2, 3, 4, 5, 6]
    assert [level(e) for e in media_events] == [1000, 2000, 3000, 4000, 5000]


def test_telnyx_controls_pass_at_once_and_share_the_numbering():
    serializer = TelnyxSerializer()
    frames = [json.dumps(START), media(2, 1000), media(4, 3000), control(3, "mark"), media(5, 4000), control(6, "dtmf")]
    events = run(serializer, frames)
    kinds = [type(e).__name__ if not isinstance(e, Media) else e.sequence for e in events[1:]]
    # media 4 waits for number 3; the mark (number 3) passes at once and releases it
    assert kinds == [2, "Mark", 4, 5, "Dtmf"]


def test_telnyx_stop_flushes_held_media_first():
    serializer = TelnyxSerializer()
    events = run(serializer, [json.dumps(START), media(3, 2000), media(5, 4000), control(6, "stop")])
    assert [e.sequence if isinstance(e, Media) else type(e) for e in events[1:]] == [3, 5, Stop]


def test_telnyx_gives_up_on_a_lost_frame():
    serializer = TelnyxSerializer(reorder_window=2)
    events = run(serializer, [json.dumps(START), *(media(s, LEVELS[s]) for s in (3, 4, 5))])
    assert [e.sequence for e in events if isinstance(e, Media)] == [3, 4, 5]
    assert run(serializer, [media(2, 1000)]) == []  # arrived after its turn was given up


def test_twilio_does_not_reorder():
    serializer = TwilioSerializer()
    start = {
        "event": "start",
        "sequenceNumber": "1",
        "streamSid": "MZ1",
        "start": {"callSid": "CA1", "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}},
    }
    frames = [json.dumps(start)]
    for seq in (3, 2):
        message = json.loads(media(seq, LEVELS[seq]))
        frames.append(
            json.dumps({"event": "media", "sequenceNumber": str(seq), "streamSid": "MZ1", "media": message["media"]})
        )
    assert [e.sequence for e in run(serializer, frames) if isinstance(e, Media)] == [3, 2]


def test_reorder_can_be_disabled():
    serializer = TelnyxSerializer(reorder_window=0)
    events = run(serializer, [json.dumps(START), media(3, 2000), media(2, 1000)])
    assert [e.sequence for e in events if isinstance(e, Media)] == [3, 2]
    assert not any(isinstance(e, Mark | Dtmf) for e in events)
