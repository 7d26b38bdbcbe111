"""The shared STT worker's scheduling, with a fake decoder (no model): finals first, stale partials dropped."""

from __future__ import annotations

import threading
import time

import numpy as np

from voicepipe.config import STTSettings
from voicepipe.stt.decoder import DecodeResult
from voicepipe.stt.transcriber import PAUSE_MS, Transcriber


class FakeDecoder:
    """Decodes audio to one word per 100 ms ('w0 w1 ...'); can be held to let jobs pile up."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.delay = 0.0
        self.empty = False  # decode to no words (as a model may for a slice of a turn)
        self.dropped = ""  # with `empty`: the words a no-speech filter dropped
        self.empty_for: set[int] = set()  # audio lengths that decode to no words

    def context_tokens(self, initial_prompt, hotwords) -> list[int]:
        return [1] if initial_prompt or hotwords else []

    def piece(self, token: int) -> str:
        return f" w{token}"

    def decode_batch(self, audios, contexts, prefixes) -> list[DecodeResult]:
        self.gate.wait(5)
        time.sleep(self.delay)
        out = []
        for audio in audios:
            n = len(audio) // 1600
            self.calls.append(("batch" if len(audios) > 1 else "one", len(audio)))
            tokens = [] if self.empty or len(audio) in self.empty_for else list(range(n))
            out.append(DecodeResult(tokens, " ".join(f"w{i}" for i in tokens), 0.0, 0.0, len(audio),
                                    dropped_text=self.dropped if self.empty else ""))
        return out


def make(**settings) -> tuple[Transcriber, FakeDecoder]:
    fake = FakeDecoder()
    return Transcriber(None, STTSettings(**settings), decoder=fake), fake


def loud(seconds: float) -> np.ndarray:
    return np.full(round(seconds * 16000), 0.1, np.float32)


def test_partials_then_final() -> None:
    stt, _ = make(partial_interval_ms=200)
    partials = []
    stream = stt.open_stream(16000, on_partial=partials.append)
    for _ in range(50):  # 1 s in 20 ms chunks
        stream.push(loud(0.02))
        time.sleep(0.005)
    final = stream.finish().result(timeout=5)
    stt.close()
    assert partials and all(not p.is_final for p in partials)
    assert final.is_final and final.text == " ".join(f"w{i}" for i in range(10))


def test_finals_go_before_waiting_partials() -> None:
    stt, fake = make(partial_interval_ms=100, stale_partial_ms=0)
    fake.gate.clear()  # hold the worker
    blocker = stt.open_stream(16000)
    blocker.push(loud(0.2))  # the job the worker is stuck on
    time.sleep(0.05)
    talkers = [stt.open_stream(16000) for _ in range(3)]
    for t in talkers:
        t.push(loud(0.3))  # partial requests, waiting (their turns go on)
    ending = [stt.open_stream(16000) for _ in range(3)]
    for s in ending:
        s.push(np.full(8000, 0.1, np.float32))
    finals = [s.finish() for s in ending]  # queued after the partials
    fake.gate.set()
    for f in finals:
        f.result(timeout=5)
    time.sleep(0.2)
    stt.close()
    assert fake.calls[0] == ("one", 3200)  # the blocker
    assert fake.calls[1:4] == [("one", 8000)] * 3  # then the finals, before any waiting partial
    assert sorted(fake.calls[4:]) == [("batch", 4800)] * 3  # then the talkers' partials, batched


def test_partial_requests_are_coalesced_and_stale_ones_dropped() -> None:
    stt, fake = make(partial_interval_ms=50, stale_partial_ms=50)
    fake.gate.clear()
    stream = stt.open_stream(16000)
    other = stt.open_stream(16000)
    other.push(loud(0.1))  # occupies the worker
    time.sleep(0.05)
    for _ in range(10):
        stream.push(loud(0.05))  # ten requests: one waits, nine are coalesced
    assert stt.stats.partials_dropped >= 9
    time.sleep(0.1)  # the waiting request goes stale
    fake.gate.set()
    time.sleep(0.2)
    stt.close()
    assert stt.stats.partials_dropped >= 10
    assert all(n != 8000 for _, n in fake.calls)  # the stale partial (0.5 s of audio) was never decoded


def test_overload_gives_a_clear_error() -> None:
    stt, fake = make(max_queue=2)
    fake.gate.clear()
    streams = [stt.open_stream(16000) for _ in range(4)]
    futures = []
    for s in streams:
        s.push(loud(0.1))
        futures.append(s.finish())
    failed = [f for f in futures if f.done() and f.exception() is not None]
    fake.gate.set()
    stt.close()
    assert failed and "max_queue" in str(failed[0].exception())


def test_callbacks_that_raise_do_not_stop_the_worker() -> None:
    stt, _ = make(partial_interval_ms=50)

    def boom(_t) -> None:
        raise RuntimeError("callback bug")

    stream = stt.open_stream(16000, on_partial=boom, on_final=boom)
    stream.push(loud(0.5))
    assert stream.finish().result(timeout=5).text
    again = stt.open_stream(16000)
    again.push(loud(0.3))
    assert again.finish().result(timeout=5).text == "w0 w1 w2"
    stt.close()


def test_silent_tail_rule() -> None:
    from voicepipe.stt.transcriber import _silent_tail

    rng = np.random.default_rng(0)
    speech = rng.normal(0, 0.1, 32000).astype(np.float32)
    audio = np.concatenate([speech, rng.normal(0, 0.002, 8000).astype(np.float32)])
    assert _silent_tail(audio, 32160, 35000)  # the decode stopped in the silence after the speech
    assert not _silent_tail(audio, 30000, 35000)  # 2000 samples of speech were not decoded
    assert not _silent_tail(audio, 32000, 40000)  # silent, but more than 250 ms missing
    assert not _silent_tail(audio, 0, 3000)


def test_final_reuses_the_pauses_partial_that_covers_the_end() -> None:
    stt, fake = make(partial_interval_ms=500)
    stream = stt.open_stream(16000)
    stream.push(loud(1.0))  # asks for a partial of this 1 s
    stream.push(np.zeros(1600, np.float32))  # 100 ms of silence: the pause's partial, of all 1.1 s
    deadline = time.monotonic() + 5
    while stt.stats.partials_done < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    final = stream.finish(end_sample=16000 + 800).result(timeout=5)
    assert final.reused and fake.calls[-1] == ("one", 17600)
    assert final.text == " ".join(f"w{i}" for i in range(11))  # the fake hears a word in every 100 ms
    other = stt.open_stream(16000)
    other.push(loud(1.0))
    while stt.stats.partials_done < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    other.push(loud(0.1))  # 100 ms more speech: the partial does not cover it
    final = other.finish(end_sample=17600).result(timeout=5)
    stt.close()
    assert not final.reused and final.text == " ".join(f"w{i}" for i in range(11))


def test_final_does_not_reuse_a_partial_that_heard_no_words() -> None:
    stt, fake = make(partial_interval_ms=500)
    fake.empty = True
    stream = stt.open_stream(16000)
    stream.push(loud(1.0))
    stream.push(np.zeros(1600, np.float32))  # the pause's partial hears nothing too
    deadline = time.monotonic() + 5
    while stt.stats.partials_done < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    fake.empty = False
    final = stream.finish(end_sample=16000 + 800).result(timeout=5)
    stt.close()
    assert not final.reused and final.text == " ".join(f"w{i}" for i in range(11))


def test_a_pause_whose_audio_decodes_to_nothing_falls_back_to_the_end_of_speech() -> None:
    stt, fake = make(partial_interval_ms=5000)
    fake.empty_for = {17600}  # the audio up to the pause's request: the model gives up on it
    stream = stt.open_stream(16000)
    stream.push(loud(1.0))
    stream.push(np.zeros(1600, np.float32))
    final = stream.finish(end_sample=16800).result(timeout=5)
    stt.close()
    assert ("one", 16800) in fake.calls and final.text == " ".join(f"w{i}" for i in range(10))


def test_covered_final_does_not_wait_behind_the_worker() -> None:
    stt, fake = make(partial_interval_ms=500)
    stream = stt.open_stream(16000)
    stream.push(loud(1.0))
    deadline = time.monotonic() + 5
    while stt.stats.partials_done == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    fake.gate.clear()  # the worker gets stuck on another call's long decode
    other = stt.open_stream(16000)
    other.push(loud(0.6))
    time.sleep(0.05)
    future = stream.finish(end_sample=16000)
    assert future.done() and future.result().reused  # ready at once, from the decode made during speech
    fake.gate.set()
    stt.close()


def test_a_pause_after_speech_asks_for_a_partial_at_once() -> None:
    stt, fake = make(partial_interval_ms=1000)
    stream = stt.open_stream(16000)
    for _ in range(20):
        stream.push(loud(0.02))  # 400 ms of speech: under the 1 s interval, no partial yet
    time.sleep(0.1)
    assert stt.stats.partials_done == 0
    for _ in range(6):
        stream.push(np.zeros(320, np.float32))  # 120 ms of silence: the pause begins
    deadline = time.monotonic() + 5
    while stt.stats.partials_done == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stt.stats.partials_done == 1
    assert fake.calls[-1][1] >= 6400 + PAUSE_MS * 16  # the decode covers the speech and the quiet that asked for it
    for _ in range(10):
        stream.push(np.zeros(320, np.float32))  # the same pause goes on: no more requests
    time.sleep(0.1)
    stt.close()
    assert stt.stats.partials_done == 1


def test_a_final_cancelled_while_decoding_leaves_the_worker_serving(caplog) -> None:
    stt, fake = make()
    fake.gate.clear()  # the worker blocks inside the decode
    first = stt.open_stream(16000)
    first.push(loud(1.0))
    cancelled = first.finish()
    time.sleep(0.1)
    assert cancelled.cancel() or cancelled.cancelled()  # a barge-in or a hang-up drops the turn
    fake.gate.set()
    second = stt.open_stream(16000)
    second.push(loud(0.5))
    assert second.finish().result(timeout=5).text.strip() == "w0 w1 w2 w3 w4"
    stt.close()
    assert "STT worker job failed" not in caplog.text


def test_peek_transcribes_up_to_a_point_and_the_turn_goes_on() -> None:
    """An early reply's transcript: the audio up to the given sample, without ending the turn or firing on_final."""
    stt, _ = make(partial_interval_ms=5000)  # no partial decodes: the peek and the final decode themselves
    finals = []
    stream = stt.open_stream(16000, on_final=finals.append)
    stream.push(loud(0.6))
    early = stream.peek(8000).result(timeout=5)  # the first 0.5 s
    assert early.is_final and early.text == " ".join(f"w{i}" for i in range(5))
    assert finals == [] and stt.stats.finals_done == 0
    stream.push(loud(0.4))  # the caller went on: the same turn
    final = stream.finish().result(timeout=5)
    stt.close()
    assert final.text == " ".join(f"w{i}" for i in range(10)) and final.turn == early.turn
    assert finals == [final] and stt.stats.finals_done == 1


def test_after_a_peek_no_partials_until_the_caller_resumes() -> None:
    """The early reply has the transcript: a partial falling due after the peek (or waiting for the worker) would
    decode the same words again while the reply's LLM prefill needs the cores. Speech after resume() asks again."""
    stt, fake = make(partial_interval_ms=100)
    partials = []
    stream = stt.open_stream(16000, on_partial=partials.append)
    fake.gate.clear()  # hold the worker on the first partial, so a second request waits behind it
    for _ in range(15):  # 300 ms of speech
        stream.push(loud(0.02))
    early = stream.peek()
    fake.gate.set()
    assert early.result(timeout=5).text == " ".join(f"w{i}" for i in range(3))
    time.sleep(0.2)
    held = len(fake.calls)
    for _ in range(5):  # a soft tail, then the quiet a pause partial would fall due in
        stream.push(loud(0.02))
    for _ in range(10):
        stream.push(np.zeros(320, np.float32))
    time.sleep(0.2)
    assert len(fake.calls) == held, fake.calls
    stream.resume()
    for _ in range(10):  # the caller goes on
        stream.push(loud(0.02))
    time.sleep(0.3)
    resumed = len(fake.calls)
    final = stream.finish().result(timeout=5)
    stt.close()
    assert resumed > held and partials[-1].text.startswith("w0 w1 w2 w3")
    assert final.text.split()[-1] == f"w{(300 + 100 + 200 + 200) // 100 - 1}"


def test_no_partials_over_silence_after_the_pause_one() -> None:
    """After speech stops, one partial at the pause; then silence asks for none (nothing new was said)."""
    stt, fake = make(partial_interval_ms=200)
    stream = stt.open_stream(16000, on_partial=lambda _: None)
    for _ in range(50):  # 1 s of speech
        stream.push(loud(0.02))
        time.sleep(0.002)
    time.sleep(0.3)
    during_speech = len(fake.calls)
    for _ in range(100):  # 2 s of silence: 10 partial intervals
        stream.push(np.zeros(320, np.float32))
        time.sleep(0.002)
    time.sleep(0.3)
    after_silence = len(fake.calls)
    stream.push(loud(0.4))  # the caller speaks again: partials resume
    time.sleep(0.3)
    resumed = len(fake.calls)
    stt.close()
    assert during_speech >= 3
    assert after_silence - during_speech == 1, fake.calls  # the pause's partial, no more
    assert resumed > after_silence


def test_at_the_end_of_speech_only_the_pause_asks_for_a_partial() -> None:
    """The interval falls due in the quiet after the last word: the pause's partial, PAUSE_MS in, is the one decode."""
    stt, fake = make(partial_interval_ms=200)
    fake.gate.clear()  # a decode that starts is held, so a later request cannot merge into it
    stream = stt.open_stream(16000, on_partial=lambda _: None)
    stream.push(loud(0.19))  # just under the interval
    stream.push(np.zeros(320, np.float32))  # 20 ms of quiet: the interval falls due here
    time.sleep(0.1)  # (a request made now would be taken by the worker)
    for _ in range(5):  # the pause goes on: 120 ms of quiet in all
        stream.push(np.zeros(320, np.float32))
    time.sleep(0.1)
    fake.gate.set()
    deadline = time.monotonic() + 5
    while stt.stats.partials_done == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    stt.close()
    assert len(fake.calls) == 1 and fake.calls[0][1] >= 3040 + PAUSE_MS * 16, fake.calls  # covers the pause's start


def test_a_turn_of_speech_with_no_words_is_logged_and_counted(caplog) -> None:
    """The VAD heard a turn that whisper gives no words for: the caller gets no reply, so the log says why."""
    stt, fake = make(partial_interval_ms=5000)
    fake.empty, fake.dropped = True, "w0 w1"
    stream = stt.open_stream(16000)
    stream.push(loud(1.0))
    with caplog.at_level("WARNING", logger="voicepipe.stt.transcriber"):
        assert stream.finish().result(timeout=5).text == ""
        stream.push(loud(0.3))  # a cough: too short to be worth a warning
        assert stream.finish().result(timeout=5).text == ""
    stt.close()
    assert stt.stats.finals_empty == 1
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "no words in 1.00 s of speech (dropped as no speech: 'w0 w1'" in warnings[0]


def test_a_decode_that_fails_for_one_stream_costs_the_streams_batched_with_it_nothing(caplog) -> None:
    """The fake decoder raises whenever the poisoned stream (the one with a prompt) is in the batch."""
    stt, fake = make(partial_interval_ms=100)
    real = fake.decode_batch

    def decode_batch(audios, contexts, prefixes):
        fake.gate.wait(5)
        if [1] in contexts:
            raise RuntimeError("injected decode fault")
        return real(audios, contexts, prefixes)

    fake.decode_batch = decode_batch
    partials: dict[str, list] = {"poisoned": [], "healthy": []}
    poisoned = stt.open_stream(16000, initial_prompt="poison", on_partial=partials["poisoned"].append)
    healthy = stt.open_stream(16000, on_partial=partials["healthy"].append)
    fake.gate.clear()
    stt.open_stream(16000).push(loud(0.3))  # the worker takes this one and waits at the gate...
    time.sleep(0.1)
    for stream in (poisoned, healthy):  # ...so these two partial requests wait together: one batch
        stream.push(loud(0.3))
    time.sleep(0.1)
    fake.gate.set()
    deadline = time.monotonic() + 5
    while not partials["healthy"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert partials["healthy"] and not partials["poisoned"]
    assert healthy.finish().result(timeout=5).text == "w0 w1 w2"
    assert "one at a time" in caplog.text
    final = poisoned.finish()
    assert isinstance(final.exception(timeout=5), RuntimeError)  # the poisoned stream's final fails, reported
    again = stt.open_stream(16000)
    again.push(loud(0.2))
    assert again.finish().result(timeout=5).text == "w0 w1"  # and the worker serves on
    stt.close()


def _said_then_paused(stream, quiet_s: float = 0.3) -> None:
    """One second of speech, then a pause: 20 ms chunks, as a call pushes them."""
    for _ in range(50):
        stream.push(loud(0.02))
    for _ in range(round(quiet_s / 0.02)):
        stream.push(np.zeros(320, np.float32))


def test_a_final_decodes_the_same_audio_whether_or_not_the_worker_was_quick() -> None:
    """The final of a pause is the decode of the audio up to the pause's own partial request (it covers the end of
    speech), so its text is the same when that partial was decoded in time (reused at once) and when the worker was
    busy (decoded for the final). Decoding up to the VAD's end instead gave one word more in the busy case."""
    end = 17600  # 1.1 s: the VAD's speech end, a little after the pause's request (1.06 s)
    quick, fake = make(partial_interval_ms=5000)
    stream = quick.open_stream(16000)
    _said_then_paused(stream)
    deadline = time.monotonic() + 5
    while quick.stats.partials_done == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    reused = stream.finish(end).result(timeout=5)
    quick.close()

    busy, held = make(partial_interval_ms=5000)
    held.gate.clear()
    blocker = busy.open_stream(16000)
    blocker.push(loud(0.2))
    blocker.finish()  # another call's final holds the worker
    time.sleep(0.05)
    stream = busy.open_stream(16000)
    _said_then_paused(stream)  # its pause's partial waits behind the blocker
    pending = stream.finish(end)
    held.gate.set()
    decoded = pending.result(timeout=5)
    busy.close()
    assert fake.calls == [("one", 16960)] and reused.reused
    assert held.calls[:2] == [("one", 3200), ("one", 16960)] and not decoded.reused
    assert decoded.text == reused.text == " ".join(f"w{i}" for i in range(10))


def test_a_final_without_a_covering_request_decodes_up_to_the_end_of_speech() -> None:
    stt, fake = make(partial_interval_ms=5000)
    stream = stt.open_stream(16000)
    for _ in range(60):  # 1.2 s of speech and no pause: the only request is none at all
        stream.push(loud(0.02))
    final = stream.finish(16000).result(timeout=5)
    stt.close()
    assert fake.calls[-1] == ("one", 16000) and final.text == " ".join(f"w{i}" for i in range(10))


def test_a_turns_lead_before_the_speech_counts_no_partial_interval() -> None:
    """The 300 ms lead a call pushes before the VAD's speech start, with its first 20 ms of speech: no partial yet
    (counted as speech it made one of the lead and a syllable, heard as "I'm"). The first comes a whole interval of
    speech after the lead, and it decodes the lead too."""
    stt, fake = make(partial_interval_ms=300)
    stream = stt.open_stream(16000)
    stream.push_before_speech(np.concatenate([np.zeros(4800, np.float32), loud(0.02)]))
    stream.push(loud(0.02))
    time.sleep(0.1)
    assert fake.calls == []
    for _ in range(14):  # 300 ms of speech after the lead, in 20 ms chunks
        stream.push(loud(0.02))
    time.sleep(0.2)
    stt.close()
    assert fake.calls == [("one", 4800 + 320 + 15 * 320)], fake.calls
