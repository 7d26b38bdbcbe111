"""caller room: the other end of a call, as `voicepipe call`, the benches, replay and the tests play it.

It connects like the provider would (Twilio, Telnyx, Vonage, Plivo, Exotel, voicepipe's native `/ws`, Asterisk
AudioSocket, or a WebRTC peer), streams caller audio at real-time pace in 20 ms frames (pacing.py), plays the
agent's audio on a local clock and answers marks as the providers do (playout.py), takes turns (turns.py),
and measures per turn what a caller would: speech start and end, first agent audio, clears (report.py). A turn
may be key presses (`keypad`): each provider's own DTMF message, RFC 4733 events on WebRTC.
Every message comes from the provider's caller serializer in transports/serializers/, next to the server's;
the server never imports this room.
"""

from voicepipe.caller.call import TRANSPORTS, call_wav, play_call, run_call, scripted_call
from voicepipe.caller.links import endpoint_url
from voicepipe.caller.report import CallResult, ClientTurn, format_report, result_summary
from voicepipe.caller.server_api import fetch_call_record, http_base
from voicepipe.caller.utterances import (
    Utterance,
    keypad,
    read_wav,
    split_utterances,
    utterance,
    voiced_span,
    write_wav,
)

__all__ = [
    "TRANSPORTS",
    "CallResult",
    "ClientTurn",
    "Utterance",
    "call_wav",
    "endpoint_url",
    "fetch_call_record",
    "format_report",
    "http_base",
    "keypad",
    "play_call",
    "read_wav",
    "result_summary",
    "run_call",
    "scripted_call",
    "split_utterances",
    "utterance",
    "voiced_span",
    "write_wav",
]
