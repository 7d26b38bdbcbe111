"""What a loudspeaker clock that runs fast does to the canceller, offline: the echo return loss enhancement of a
call's echo path (delay estimate, clock skew and Speex, `voicepipe.echo.path.EchoPath`, the level gate left out)
when the echo is the agent's audio played `skew` faster than the microphone samples it (0.001: 0.1 %, as `bench
echo`'s grid plays it), against the same echo with no skew in the same run.

The agent gives six replies of two espeak-ng sentences each (about 4 s), 1.5 s apart, mu-law coded; the caller's
loudspeaker starts each reply on time and plays it `skew` fast (as `caller.echo.SpeakerEcho` does), and
`echo.simulate`'s room returns it at each delay and level, with the noise floor, clipping and mu-law of the way back.
No caller speaks. ERLE is the microphone's power over the canceller's output, in dB, over a reply's span:
`first_reply`, `second_reply` and `last_reply`.

JSON: flat keys `<delay>ms.<level>dB.skew<skew>[.unfollowed].<reply>_erle_db`, and
`<reply>_erle_over_no_skew.skew<skew>[.unfollowed]`: the mean over the delays and levels of each skew's ERLE over the
no-skew ERLE of the same call (`.unfollowed`: the reference read as sent, `EchoPath(follow_clock=False)`).

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
REPLIES = 6
GAP_S = 1.5
REPORTED = {"first_reply": 0, "second_reply": 1, "last_reply": REPLIES - 1}


def replies() -> list[np.ndarray]:
    """Each reply's audio as the line carries it: two of the sentences, in turn."""
    said = [simulate.spoken(t, RATE) for t in AGENT]
    return [simulate.mulaw(0.5 * np.concatenate([said[(2 * r) % 4], said[(2 * r + 1) % 4]])) for r in range(REPLIES)]


def erle(said: list[np.ndarray], delay_ms: float, level_db: float, skew: float, follow: bool) -> dict[str, float]:
    gap = int(GAP_S * RATE)
    starts = np.cumsum([0] + [len(a) + gap for a in said[:-1]])
    loudspeaker = np.zeros(starts[-1] + len(said[-1]), np.float32)
    reference = FarEndReference(RATE, capacity_s=len(loudspeaker) / RATE + 1)
    for at, audio in zip(starts, said, strict=True):
        reference.append(audio, at=int(at))
        loudspeaker[at:at + len(audio)] = simulate.fast_playout(audio, skew)
    mic = float32_to_int16(simulate.microphone(simulate.echo_of(loudspeaker, RATE, delay_ms, level_db),
                                               np.zeros_like(loudspeaker)))
    path = EchoPath(reference, follow_clock=follow)
    path.gate.process = lambda block, *_: block  # the canceller's work alone
    out = np.concatenate([path.process(mic[i:i + FRAME]) for i in range(0, len(mic), FRAME)])
    figures = {}
    lag = int(delay_ms * RATE / 1000)
    for name, r in REPORTED.items():
        span = slice(starts[r] + lag, starts[r] + lag + len(said[r]))
        near, left = mic[span].astype(np.float64), out[span].astype(np.float64)
        figures[f"{name}_erle_db"] = round(10 * np.log10(np.mean(near**2) / max(np.mean(left**2), 1e-9)), 2)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delays", type=float, nargs="+", default=[20, 150, 400])
    parser.add_argument("--levels", type=float, nargs="+", default=[-6, -20])
    parser.add_argument("--skews", type=float, nargs="+", default=[0.0002, 0.0005, 0.001])
    parser.add_argument("--json", type=Path, help="write the flat results here")
    args = parser.parse_args()
    said = replies()
    results: dict[str, float] = {}
    ratios: dict[str, list[float]] = {}
    for delay in args.delays:
        for level in args.levels:
            base = erle(said, delay, level, 0.0, follow=True)
            for skew in [0.0, *args.skews]:
                for follow in (True, False) if skew else (True,):
                    row = base if skew == 0.0 else erle(said, delay, level, skew, follow)
                    side = "" if follow else ".unfollowed"
                    for key, value in row.items():
                        results[f"{delay:g}ms.{level:g}dB.skew{skew:g}{side}.{key}"] = value
                        if skew:
                            reply = key.removesuffix("_erle_db")
                            ratios.setdefault(f"{reply}_erle_over_no_skew.skew{skew:g}{side}", []).append(
                                value / base[key])
                    print(f"{delay:4g} ms {level:4g} dB skew {skew:g}{side}: "
                          + " ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    results.update({key: round(float(np.mean(values)), 3) for key, values in ratios.items()})
    print({k: v for k, v in results.items() if "over_no_skew" in k})
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
