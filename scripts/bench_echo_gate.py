"""The level gate offline, against the canceller alone in the same run: what reaches the VAD of a call that cancels
echo, on `voicepipe.echo.simulate`'s echo path (16 kHz, the agent's espeak-ng speech mu-law coded, a room tail),
with and without `EchoLevelGate` after Speex.

For each echo delay and level: 3 agent sentences (12 s), echo alone, then the caller (another espeak-ng voice)
talking over the agent from 8 s for 3.4 s. Silero (the default model, `models fetch`) runs on what the call's VAD
would hear. Per scenario and side (`gate`, `canceller`):

- `echo_segments`: speech segments the VAD found outside the caller's speech (each would hold the agent, and with
  words, barge in);
- `caller_segments`: speech segments inside it (1 is whole; more is the caller's speech cut up);
- `cpu_ms_per_s`: the echo path's process CPU per second of audio.

JSON: flat keys `<side>.<delay>ms.<level>dB.<metric>`, totals `<side>.echo_segments` and `<side>.caller_segments`
over the grid, and `gate_over_canceller_cpu` (the gate's cost as a ratio).

    python scripts/bench_echo_gate.py --json gate.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from voicepipe.audio.l16 import float32_to_int16
from voicepipe.config import load_settings
from voicepipe.echo import simulate
from voicepipe.echo.path import EchoPath
from voicepipe.echo.reference import FarEndReference
from voicepipe.vad.silero import SileroVAD

RATE = 16000
FRAME = 320
AGENT = ["Thank you for calling the city library, how can I help you today?",
         "Your books are due back on the fourteenth of next month.",
         "I can renew them for another three weeks if you would like.",
         "The branch on Main Street opens at nine in the morning."]
CALLER = "Actually I wanted to ask about the opening hours on Sunday."
CALLER_AT_S = 8.0


def signals() -> tuple[np.ndarray, np.ndarray, tuple[float, float]]:
    pause = np.zeros(RATE // 2, np.float32)
    far = simulate.mulaw(0.5 * np.concatenate([np.concatenate([simulate.spoken(t, RATE), pause]) for t in AGENT]))
    caller = 0.5 * simulate.spoken(CALLER, RATE, voice="en-us+f3", speed=1.1)
    near = np.zeros_like(far)
    start = int(CALLER_AT_S * RATE)
    near[start:start + len(caller)] = caller
    return far, near, (CALLER_AT_S, CALLER_AT_S + len(caller) / RATE)


def heard(far: np.ndarray, mic: np.ndarray, gate: bool) -> tuple[np.ndarray, float]:
    """What the call's VAD hears of `mic`, and the echo path's CPU (s)."""
    reference = FarEndReference(RATE, capacity_s=len(far) / RATE + 1)
    reference.append(far, at=0)
    path = EchoPath(reference)
    if not gate:
        path.gate.process = lambda block, *_: block
    samples = float32_to_int16(mic)
    started = time.process_time()
    out = np.concatenate([path.process(samples[i:i + FRAME]) for i in range(0, len(samples), FRAME)])
    return out, time.process_time() - started


def segments(vad: SileroVAD, audio: np.ndarray) -> list[tuple[float, float]]:
    stream = vad.stream(RATE)
    events = [e for i in range(0, len(audio), 512) for e in stream.push(audio[i:i + 512])] + stream.flush()
    found, start = [], None
    for event in events:
        if event.kind == "speech_start":
            start = event.seconds
        elif event.kind == "speech_end" and start is not None:
            found.append((start, event.seconds))
            start = None
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delays", type=float, nargs="+", default=[20, 150, 400])
    parser.add_argument("--levels", type=float, nargs="+", default=[-6, -10, -20, -30, -40])
    parser.add_argument("--json", type=Path, help="write the flat results here")
    args = parser.parse_args()
    vad = SileroVAD.load(load_settings().paths.models_dir / "silero-vad-v6" / "silero_vad_v6.onnx")
    far, near, (caller_from, caller_to) = signals()
    results: dict[str, float] = {}
    cpu = {"gate": 0.0, "canceller": 0.0}
    for delay in args.delays:
        for level in args.levels:
            mic = simulate.microphone(simulate.echo_of(far, RATE, delay, level), near)
            for side in ("canceller", "gate"):
                out, seconds = heard(far, mic, gate=side == "gate")
                found = segments(vad, out)
                caller = [s for s in found if s[1] > caller_from and s[0] < caller_to]
                row = {"echo_segments": len(found) - len(caller), "caller_segments": len(caller),
                       "cpu_ms_per_s": round(1000 * seconds / (len(mic) / RATE), 2)}
                cpu[side] += seconds
                for key, value in row.items():
                    results[f"{side}.{delay:g}ms.{level:g}dB.{key}"] = value
                    if key != "cpu_ms_per_s":
                        results[f"{side}.{key}"] = results.get(f"{side}.{key}", 0) + value
                print(f"{delay:4g} ms {level:4g} dB {side:10s} " + " ".join(f"{k}={v}" for k, v in row.items()),
                      flush=True)
    results["gate_over_canceller_cpu"] = round(cpu["gate"] / cpu["canceller"], 3)
    print({k: v for k, v in results.items() if k.count(".") <= 1})
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
