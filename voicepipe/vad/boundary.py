"""Where speech acoustically ends, for the turn timeline.

The VAD's speech_end is only near the caller's last sound: it lies at a model-window boundary, past the last
window scored as speech (its hysteresis keeps the fading tail of a word) plus `padding_ms` for the STT, so
often 40-80 ms late; yet a soft final fricative ("France") may score as silence, which puts it 40 ms early.
The timeline wants the moment the caller stopped, since voice-to-voice is measured from it, so the end is moved
to the edge of the audible sound: back over quiet frames, or forward over audible frames that run on from it.
"""

from __future__ import annotations

import numpy as np

FRAME_MS = 10
AUDIBLE_PEAK = 300  # int16 peak (about -40 dBFS) below which a frame is not speech
NOISE_MARGIN = 4.0  # on a noisy line a frame must peak this many times above the quietest frames
SEARCH_MS = 150  # how far the end may move either way


def audible_end(audio: np.ndarray, end: int, rate: int, search_ms: int = SEARCH_MS) -> int:
    """`end` moved, by at most `search_ms` either way, to the end of the audible sound it falls in or after.

    A frame is audible when it peaks above `AUDIBLE_PEAK` and `NOISE_MARGIN` times the quietest tenth of
    `audio`'s frames. `end` stays where it is when no frame before it within `search_ms` is audible (a fade the
    VAD still heard) or `audio` does not reach that far back."""
    frame = rate * FRAME_MS // 1000
    reach = search_ms // FRAME_MS
    if frame <= 0 or end - reach * frame < 0 or end > len(audio):
        return end
    floor = max(AUDIBLE_PEAK, NOISE_MARGIN * float(np.percentile(_frame_peaks(audio, frame), 10)))
    before = _frame_peaks(audio[end - reach * frame: end], frame) >= floor  # oldest first
    after = _frame_peaks(audio[end: end + reach * frame], frame) >= floor
    if before[-1]:  # sound runs up to the VAD's end: follow it forward while it lasts
        quiet = np.flatnonzero(~after)
        return end + (int(quiet[0]) if len(quiet) else len(after)) * frame
    audible = np.flatnonzero(before)
    if len(audible) == 0:
        return end
    return end - (reach - 1 - int(audible[-1])) * frame


def _frame_peaks(audio: np.ndarray, frame: int) -> np.ndarray:
    n = len(audio) // frame
    return np.abs(audio[len(audio) - n * frame:].astype(np.int32)).reshape(n, frame).max(axis=1)
