"""What a loudspeaker clock that runs fast does to the canceller, offline: the echo return loss enhancement of a
call's echo path (delay estimate and Speex, `voicepipe.echo.path.EchoPath`, the level gate left out) when the echo
is the agent's audio played `skew` faster than the microphone samples it (0.001: 0.1 %, as `bench echo`'s grid
plays it), against the same echo with no skew in the same run.

The agent says four espeak-ng sentences with half-second pauses (8 s, mu-law coded); `echo.simulate`'s room returns
them at each delay and level, with the noise floor, clipping and mu-law of the way back. No caller speaks. ERLE is
the microphone's power over the canceller's output, in dB, over two spans: `early` (1.5-4 s: the first delay
reading comes at 1.5 s) and `late` (4-8 s: where the drift has added up to 4-8 ms at 0.1 %).

JSON: flat keys `<delay>ms.<level>dB.skew<skew>.<span>_erle_db`, and `<span>_erle_over_no_skew.skew<skew>`: the
mean over the delays and levels of each skew's ERLE over the no-skew ERLE of the same call.

    python scripts/bench_echo_skew.py --json skew.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from voicepipe.audio.l16 import float32_to_int16
from voicepipe.echo import simulate
from voicepipe.echo.path import EchoPath
from voicepipe.echo.reference import FarEndReference

RATE = 16000
FRAME = 320
AGENT = ["Thank you for calling, your order is on its way to you now.",
         "It should arrive on Thursday before noon at the latest.",
         "I can send you a text message with the tracking number.",
         "Is there anything else I can help you with today?"]
SPANS = {"early": (1.5, 4.0), "late": (4.0, 8.0)}


def agent_audio() -> np.ndarray:
    pause = np.zeros(RATE // 2, np.float32)
    far = np.concatenate([np.concatenate([simulate.spoken(t, RATE), pause]) for t in AGENT])
    return simulate.mulaw(0.5 * far[: 8 * RATE])


def played(far: np.ndarray, skew: float) -> np.ndarray:
    """`far` as a loudspeaker `skew` fast plays it, sampled by the microphone's clock."""
    return np.interp(np.arange(len(far)) * (1.0 + skew), np.arange(len(far)), far).astype(np.float32)


def erle(far: np.ndarray, delay_ms: float, level_db: float, skew: float) -> dict[str, float]:
    mic = float32_to_int16(simulate.microphone(simulate.echo_of(played(far, skew), RATE, delay_ms, level_db),
                                               np.zeros_like(far)))
    reference = FarEndReference(RATE, capacity_s=len(far) / RATE + 1)
    reference.append(far, at=0)
    path = EchoPath(reference)
    path.gate.process = lambda block, *_: block  # the canceller's work alone
    out = np.concatenate([path.process(mic[i:i + FRAME]) for i in range(0, len(mic), FRAME)])
    figures = {}
    for span, (a, b) in SPANS.items():
        near, left = (x[int(a * RATE):int(b * RATE)].astype(np.float64) for x in (mic, out))
        figures[f"{span}_erle_db"] = round(10 * np.log10(np.mean(near**2) / max(np.mean(left**2), 1e-9)), 2)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delays", type=float, nargs="+", default=[20, 150, 400])
    parser.add_argument("--levels", type=float, nargs="+", default=[-6, -20])
    parser.add_argument("--skews", type=float, nargs="+", default=[0.0002, 0.0005, 0.001])
    parser.add_argument("--json", type=Path, help="write the flat results here")
    args = parser.parse_args()
    far = agent_audio()
    results: dict[str, float] = {}
    ratios: dict[str, list[float]] = {}
    for delay in args.delays:
        for level in args.levels:
            base = erle(far, delay, level, 0.0)
            for skew in [0.0, *args.skews]:
                row = base if skew == 0.0 else erle(far, delay, level, skew)
                for key, value in row.items():
                    results[f"{delay:g}ms.{level:g}dB.skew{skew:g}.{key}"] = value
                    if skew:
                        span = key.removesuffix("_erle_db")
                        ratios.setdefault(f"{span}_erle_over_no_skew.skew{skew:g}", []).append(value / base[key])
                print(f"{delay:4g} ms {level:4g} dB skew {skew:g}: " + " ".join(f"{k}={v}" for k, v in row.items()),
                      flush=True)
    results.update({key: round(float(np.mean(values)), 3) for key, values in ratios.items()})
    print({k: v for k, v in results.items() if "over_no_skew" in k})
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
