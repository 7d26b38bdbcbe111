"""`voicepipe bench sip`: call setup and voice-to-voice over SIP (/sip, SIP over WebSocket) against the same calls
over voicepipe's own WebRTC signalling (POST /webrtc/offer), in one run on one in-process server.

- Setup: the client's offer sent to the answer back: SIP's INVITE to its 200 OK (with `--digest`, from the first
  INVITE, through its 401 and the INVITE with credentials, as a web phone with a password sees it), WebRTC's
  POST to its response. `setups` calls of each, alternating, each hung up once its media is connected.
- Voice-to-voice: `rounds` calls of `turns` turns over each (the order alternating per round, so the machine's
  noise falls on both alike); the caller's last voiced sample sent to the first agent audio received. Beside
  the ratio of the p50s, `voice_to_voice_paired_ratio` is the median over (round, turn) of SIP's turn over the
  same turn of the same round over WebRTC, which a machine whose load drifts moves less; and the server's
  `response` (end-of-turn decision to first audio on the wire) shows whether a difference is the server's.

The media and the call are the same code on both (an aiortc peer run by `Connection`), so the figures isolate
what the signalling costs. One call is made first, uncounted, to warm the models up.
"""

from __future__ import annotations

import asyncio
import secrets
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from voicepipe.bench.call import make_utterances, stats
from voicepipe.caller import run_call
from voicepipe.caller.sip import SipPeerClient
from voicepipe.caller.webrtc import PeerClient
from voicepipe.config import Settings
from voicepipe.server import serve_in_thread

TRANSPORTS = ("sip", "webrtc")
SETUP_TARGET_MS = 300.0  # the target: INVITE to 200 OK p50 on these CPUs
V2V_TARGET_RATIO = 1.10  # voice-to-voice over SIP within 10 % of WebRTC


async def _setup_ms(base: str, transport: str, params: dict[str, Any]) -> float:
    client = SipPeerClient if transport == "sip" else PeerClient
    async with client(base, f"setup-{secrets.token_hex(6)}", params) as peer:
        setup = peer.setup_ms
        await peer.send('{"type": "stop", "reason": "hangup"}')
    return setup


def run_sip_bench(settings: Settings, rounds: int = 3, turns: int = 3, setups: int = 20, digest: bool = False,
                  progress: Callable[[str], None] = print) -> dict[str, Any]:
    settings = settings.model_copy(deep=True)
    sip_params: dict[str, Any] = {}
    if digest:
        password = secrets.token_hex(8)
        settings.sip.users = {"bench": password}
        sip_params = {"user": "bench", "password": password}
    params = {"sip": sip_params, "webrtc": {}}
    setup: dict[str, list[float]] = {t: [] for t in TRANSPORTS}
    v2v: dict[str, list[float]] = {t: [] for t in TRANSPORTS}
    response: dict[str, list[float]] = {t: [] for t in TRANSPORTS}
    paired: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        settings.paths.data_dir = Path(tmp) / "data"
        settings.paths.recordings_dir = Path(tmp) / "recordings"
        utterances = make_utterances(turns, Path(tmp))
        progress("starting an in-process server (models load first)")
        with serve_in_thread(settings) as (base, _app):
            asyncio.run(run_call(base, "webrtc", utterances[:1], quiet_s=0.6, reply_timeout_s=120))  # warm-up
            for i in range(setups):
                for transport in TRANSPORTS if i % 2 == 0 else TRANSPORTS[::-1]:
                    setup[transport].append(asyncio.run(_setup_ms(base, transport, params[transport])))
            progress(f"setup p50: sip {stats(setup['sip'])['p50']} ms, webrtc {stats(setup['webrtc'])['p50']} ms")
            for i in range(rounds):
                by_turn: dict[str, dict[int, float]] = {}
                for transport in TRANSPORTS if i % 2 == 0 else TRANSPORTS[::-1]:
                    result = asyncio.run(run_call(base, transport, utterances, params=params[transport],
                                                  quiet_s=0.6, reply_timeout_s=120))
                    by_turn[transport] = {t.index: t.voice_to_voice_ms for t in result.turns
                                          if t.voice_to_voice_ms is not None}
                    v2v[transport] += list(by_turn[transport].values())
                    response[transport] += [t["timings_ms"]["response"] for t in (result.record or {}).get("turns", [])
                                            if "response" in t.get("timings_ms", {})]
                    progress(f"round {i + 1}/{rounds} over {transport}: {len(result.turns)} turns")
                paired += [by_turn["sip"][k] / by_turn["webrtc"][k] for k in by_turn["sip"]
                           if by_turn["webrtc"].get(k)]
    report: dict[str, Any] = {
        "rounds": rounds, "turns": turns, "setups": setups, "digest": digest,
        "setup_ms": {t: stats(setup[t]) for t in TRANSPORTS},
        "voice_to_voice_ms": {t: stats(v2v[t]) for t in TRANSPORTS},
        "response_ms": {t: stats(response[t]) for t in TRANSPORTS},
        "voice_to_voice_paired_ratio": round(float(np.median(paired)), 3) if paired else None,
    }
    report["voice_to_voice_sip_over_webrtc"] = _ratio(report["voice_to_voice_ms"]["sip"]["p50"],
                                                      report["voice_to_voice_ms"]["webrtc"]["p50"])
    report["setup_sip_over_webrtc"] = _ratio(report["setup_ms"]["sip"]["p50"], report["setup_ms"]["webrtc"]["p50"])
    report["targets"] = {
        "setup_p50_ms_at_most": SETUP_TARGET_MS,
        "setup_met": (report["setup_ms"]["sip"]["p50"] or float("inf")) <= SETUP_TARGET_MS,
        "voice_to_voice_ratio_at_most": V2V_TARGET_RATIO,
        "voice_to_voice_met": (report["voice_to_voice_sip_over_webrtc"] or float("inf")) <= V2V_TARGET_RATIO,
    }
    return report


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None
