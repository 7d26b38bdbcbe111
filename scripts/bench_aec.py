"""Echo cancellers measured on a synthetic telephone echo, against no cancellation in the same run: SpeexDSP's
MDF canceller (Debian `libspeexdsp1`, `voicepipe.echo.canceller`), WebRTC's AEC3 (the `pywebrtc-audio` wheel)
and WebRTC's legacy AEC (Debian `libwebrtc-audio-processing1`). The last two are not voicepipe dependencies:
`pip install pywebrtc-audio==0.2.0` and `apt-get install libwebrtc-audio-processing1` to measure them; a
candidate whose library is missing is left out.

For each rate (8 and 16 kHz), echo delay (20/150/400 ms) and echo level (-6/-20/-35 dB), the agent's espeak-ng
speech (mu-law coded) returns through `voicepipe.echo.simulate`'s echo path: 8 s of echo alone, then the caller
talks over it (double talk). Every candidate runs in 20 ms frames, as a call would. Per candidate and scenario:

- `erle_db`: echo return loss enhancement over the last 4 s of echo alone (input over output power); the line's
  noise floor (-70 dBFS) bounds it at -35 dB echo, so `residual_dbfs`, the output's level there, is given too;
- `convergence_ms`: from the first far-end sound until the ERLE of a 500 ms window first comes within 3 dB of
  `erle_db` (null below 3 dB);
- `dt_snr_db`: the output against the caller's clean voice during double talk, as the SNR of their magnitude
  spectrograms in 300-3400 Hz, after `latency_ms`, how long the candidate holds the voice back;
- `cpu_ms_per_s`: process CPU time per second of audio (CPU, not wall time: the machine is shared).

"_aligned" candidates pass the input through until `voicepipe.echo.delay`'s estimate exists, then get the
reference read `canceller.held_lag` back; the others get the reference as it played and must cover the
delay themselves (AEC3 estimates it; Speex's 600 ms filter spans 400 ms of delay plus the 120 ms tail).
JSON: flat keys `<candidate>.<rate>.<delay>ms.<level>dB.<metric>`, means over the grid `<candidate>.<metric>`,
`<candidate>.erle_db_min`, and `<candidate>.dt_snr_over_none_db` (dB figures: differences, not ratios).

    python scripts/bench_aec.py --json aec.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import time
from collections.abc import Callable

import numpy as np

from voicepipe.audio.l16 import float32_to_int16, int16_to_float32
from voicepipe.echo import simulate
from voicepipe.echo.canceller import EchoCanceller, held_lag
from voicepipe.echo.delay import DelayEstimator

AGENT = [
    "Thank you for calling the city library, how can I help you today?",
    "Your books are due back on the fourteenth of next month.",
    "I can renew them for another three weeks if you would like.",
    "The branch on Main Street opens at nine in the morning.",
]
CALLER = "Actually I wanted to ask about the opening hours on Sunday and whether parking is free there."
SINGLE_TALK_S = 8
FRAME_MS = 20
METRICS = ["erle_db", "residual_dbfs", "dt_snr_db", "convergence_ms", "latency_ms", "cpu_ms_per_s"]

Processor = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (near int16 frame, far int16 frame) -> out int16


def webrtc_aec3(rate: int) -> Processor | None:
    """Only AEC3: no noise suppression, no gain control (AEC3 puts its own high-pass filter first)."""
    try:
        from pywebrtc_audio import AudioProcessor
    except ImportError:
        return None
    return AudioProcessor(sample_rate=rate, echo_cancellation=True).process


class WebRtcLegacyAec:
    """Debian's `libwebrtc-audio-processing1` (0.3, a 2016 WebRTC snapshot, before AEC3): its C API to the legacy
    AEC, in 10 ms blocks of floats on the int16 scale, with delay-agnostic mode and the extended filter (the
    settings for a delay nobody reports), through ctypes."""

    def __init__(self, lib: ctypes.CDLL, rate: int) -> None:
        self._lib = lib
        self.block = rate // 100
        self._aec = lib.WebRtcAec_Create()
        lib.WebRtcAec_Init(self._aec, rate, rate)
        core = lib.WebRtcAec_aec_core(self._aec)
        lib.WebRtcAec_enable_delay_agnostic(core, 1)
        lib.WebRtcAec_enable_extended_filter(core, 1)
        self._out = np.zeros(self.block, np.float32)

    @classmethod
    def make(cls, rate: int) -> Processor | None:
        try:
            lib = ctypes.CDLL("libwebrtc_audio_processing.so.1")
        except OSError:
            return None
        lib.WebRtcAec_Create.restype = ctypes.c_void_p
        lib.WebRtcAec_Init.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32]
        lib.WebRtcAec_aec_core.restype = ctypes.c_void_p
        lib.WebRtcAec_aec_core.argtypes = [ctypes.c_void_p]
        lib.WebRtcAec_enable_delay_agnostic.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.WebRtcAec_enable_extended_filter.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.WebRtcAec_BufferFarend.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        lib.WebRtcAec_Process.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        lib.WebRtcAec_Process.argtypes += [ctypes.c_size_t, ctypes.c_int16, ctypes.c_int32]
        return cls(lib, rate).process

    def process(self, near: np.ndarray, far: np.ndarray) -> np.ndarray:
        out = np.empty_like(near)
        out_bands = (ctypes.c_void_p * 1)(self._out.ctypes.data)
        for lo in range(0, len(near), self.block):
            far_block = far[lo : lo + self.block].astype(np.float32)
            near_block = near[lo : lo + self.block].astype(np.float32)
            self._lib.WebRtcAec_BufferFarend(self._aec, far_block.ctypes.data, self.block)
            near_bands = (ctypes.c_void_p * 1)(near_block.ctypes.data)
            self._lib.WebRtcAec_Process(self._aec, near_bands, 1, out_bands, self.block, 0, 0)
            out[lo : lo + self.block] = np.clip(np.round(self._out), -32768, 32767)
        return out


def speex(filter_ms: float, residual: bool) -> Callable[[int], Processor]:
    return lambda rate: EchoCanceller(rate, FRAME_MS, filter_ms, residual).process


# name -> (make(rate): the processor, or None when its library is missing; whether it gets the aligned reference)
CANDIDATES: dict[str, tuple[Callable[[int], Processor | None], bool]] = {
    "none": (lambda rate: lambda near, far: near, False),
    "webrtc_aec3": (webrtc_aec3, False),
    "webrtc_aec3_aligned": (webrtc_aec3, True),
    "webrtc_legacy_debian": (WebRtcLegacyAec.make, False),
    "speex_600ms": (speex(600, residual=False), False),
    "speex_600ms_res": (speex(600, residual=True), False),
    "speex_200ms_aligned_res": (speex(200, residual=True), True),
}


def run(process: Processor, far: np.ndarray, mic: np.ndarray, rate: int, aligned: bool) -> tuple[np.ndarray, float]:
    """The output of `process` over the call, and its CPU ms per second of audio."""
    frame = rate * FRAME_MS // 1000
    far16, mic16 = float32_to_int16(far), float32_to_int16(mic)
    out = mic16.copy()
    estimator = DelayEstimator(rate) if aligned else None
    lag = None
    started = time.process_time()
    for start in range(0, len(mic16) - frame + 1, frame):
        if estimator is not None:
            estimator.push(far[start : start + frame], mic[start : start + frame])
            if estimator.delay is None:
                continue
            lag = held_lag(lag, estimator.delay, rate)
        lo = start - (lag or 0)
        ref = far16[lo : lo + frame] if lo >= 0 else np.zeros(frame, np.int16)
        out[start : start + frame] = process(mic16[start : start + frame], ref)
    cpu = time.process_time() - started
    return int16_to_float32(out), 1000 * cpu / (len(mic) / rate)


def power_db(audio: np.ndarray) -> float:
    return float(10 * np.log10(max(np.mean(audio.astype(np.float64) ** 2), 1e-20)))


def metrics(mic: np.ndarray, out: np.ndarray, near: np.ndarray, rate: int, onset: int) -> dict[str, float | None]:
    st = SINGLE_TALK_S * rate
    steady = power_db(mic[st - 4 * rate : st]) - power_db(out[st - 4 * rate : st])
    convergence = None
    if steady >= 3:
        win = rate // 2
        for start in range(onset, st - win + 1, rate // 20):
            if power_db(mic[start : start + win]) - power_db(out[start : start + win]) >= steady - 3:
                convergence = 1000 * (start + win - onset) / rate
                break
    lag = latency(out[st:], near[st:], rate)
    clean, got = magnitudes(near[st : len(near) - lag], rate), magnitudes(out[st + lag :], rate)
    talk = clean.sum(axis=1) > 0.01 * clean.sum(axis=1).max()
    clean, got = clean[talk], got[talk]
    return {
        "erle_db": steady,
        "residual_dbfs": power_db(out[st - 4 * rate : st]),
        "dt_snr_db": float(10 * np.log10(np.sum(clean**2) / np.sum((got - clean) ** 2))),
        "convergence_ms": convergence,
        "latency_ms": 1000 * lag / rate,
    }


def latency(out: np.ndarray, near: np.ndarray, rate: int) -> int:
    """How many samples the candidate holds the caller's voice back (resampling, lookahead): the lag, 0-50 ms,
    at which the output best matches the clean voice."""
    return max(range(rate // 20 + 1), key=lambda k: float(np.dot(out[k:], near[: len(near) - k])))


def magnitudes(audio: np.ndarray, rate: int) -> np.ndarray:
    """Magnitude spectrogram (32 ms Hann frames, 16 ms hop) in 300-3400 Hz. Magnitudes, not waveforms: the DC
    notch and high-pass filters the cancellers put first turn the phase of the low band (35 degrees at 400 Hz
    for Speex) without changing what the STT hears, and a waveform SNR would count that as damage."""
    size, hop = rate * 32 // 1000, rate * 16 // 1000
    frames = np.lib.stride_tricks.sliding_window_view(audio, size)[::hop] * np.hanning(size)
    freqs = np.fft.rfftfreq(size, 1 / rate)
    return np.abs(np.fft.rfft(frames, axis=1))[:, (freqs >= 300) & (freqs <= 3400)]


def signals(rate: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The agent's audio as sent (mu-law), the caller's clean voice (silent for the first `SINGLE_TALK_S`), and
    the agent's first sound."""
    gap = np.zeros(int(0.4 * rate), np.float32)
    far = np.concatenate([np.concatenate([simulate.spoken(t, rate), gap]) for t in AGENT])
    far = simulate.mulaw(0.5 * far / np.max(np.abs(far)))
    near = np.zeros_like(far)
    caller = 0.5 * simulate.spoken(CALLER, rate, "en-gb+f3", 150, pitch=80, speed=1.05)
    st = SINGLE_TALK_S * rate
    near[st : st + len(caller)] = caller[: len(far) - st]
    return far, near, int(np.argmax(np.abs(far) > 0.01))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=int, nargs="+", default=[8000, 16000])
    parser.add_argument("--delays", type=float, nargs="+", default=[20, 150, 400])
    parser.add_argument("--levels", type=float, nargs="+", default=[-6, -20, -35])
    parser.add_argument("--json", help="write the flat results here")
    args = parser.parse_args()
    results: dict[str, float | None] = {}
    grid: dict[str, dict[str, list[float]]] = {}
    missing: set[str] = set()
    for rate in args.rates:
        far, near, onset = signals(rate)
        for delay in args.delays:
            for level in args.levels:
                mic = simulate.microphone(simulate.echo_of(far, rate, delay, level), near)
                for name, (make, aligned) in CANDIDATES.items():
                    process = make(rate)
                    if process is None:
                        missing.add(name)
                        continue
                    out, cpu = run(process, far, mic, rate, aligned)
                    row = {**metrics(mic, out, near, rate, onset), "cpu_ms_per_s": cpu}
                    for key, value in row.items():
                        results[f"{name}.{rate}.{delay:g}ms.{level:g}dB.{key}"] = value
                        if value is not None:
                            grid.setdefault(name, {}).setdefault(key, []).append(value)
                    cells = " ".join(f"{k}={'-' if v is None else f'{v:.1f}'}" for k, v in row.items())
                    print(f"{rate} {delay:g}ms {level:g}dB {name:24s} {cells}", flush=True)
    scenarios = len(args.rates) * len(args.delays) * len(args.levels)
    print(f"\nmeans over {scenarios} scenarios (erle_db: mean / min; converged: scenarios with a convergence_ms)")
    print(f"{'candidate':24s} {'erle_db':>13s} " + " ".join(f"{k:>14s}" for k in METRICS[1:]) + "  converged")
    for name, figures in grid.items():
        for key, values in figures.items():
            results[f"{name}.{key}"] = float(np.mean(values))
        results[f"{name}.erle_db_min"] = float(np.min(figures["erle_db"]))
        results[f"{name}.dt_snr_over_none_db"] = results[f"{name}.dt_snr_db"] - results["none.dt_snr_db"]
        converged = len(figures.get("convergence_ms", []))
        cells = [f"{np.mean(figures[k]):14.1f}" if figures.get(k) else f"{'-':>14s}" for k in METRICS[1:]]
        erle = f"{np.mean(figures['erle_db']):5.1f} / {np.min(figures['erle_db']):5.1f}"
        print(f"{name:24s} {erle:>13s} " + " ".join(cells) + f"  {converged:>4d}/{scenarios}")
    for name in sorted(missing):
        print(f"{name}: left out, its library is not installed")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
