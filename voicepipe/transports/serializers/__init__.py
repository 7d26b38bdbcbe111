"""One module per provider, holding both ends of its wire format: the server's pure serializer and the caller's
(what the provider, or a client app, sends and parses), by name."""

from typing import Any

from voicepipe.transports.serializers.audiosocket import AudioSocketCallerSerializer, AudioSocketSerializer
from voicepipe.transports.serializers.base import CallerSerializer, ChunkPolicy, DecodeResult, Serializer
from voicepipe.transports.serializers.exotel import ExotelCallerSerializer, ExotelSerializer
from voicepipe.transports.serializers.native import (
    NativeCallerSerializer,
    NativeSerializer,
    SipCallerSerializer,
    WebRtcCallerSerializer,
)
from voicepipe.transports.serializers.plivo import PlivoCallerSerializer, PlivoSerializer
from voicepipe.transports.serializers.telnyx import TelnyxCallerSerializer, TelnyxSerializer
from voicepipe.transports.serializers.twilio import TwilioCallerSerializer, TwilioSerializer
from voicepipe.transports.serializers.vonage import VonageCallerSerializer, VonageSerializer

SERIALIZERS: dict[str, type[Serializer]] = {
    "twilio": TwilioSerializer,
    "telnyx": TelnyxSerializer,
    "vonage": VonageSerializer,
    "plivo": PlivoSerializer,
    "exotel": ExotelSerializer,
    "native": NativeSerializer,
    "audiosocket": AudioSocketSerializer,
}

# A WebRTC call's server end is the native serializer (over webrtc/link.py, signalled by /webrtc/offer or by SIP
# at /sip); its caller's end is its own.
CALLER_SERIALIZERS: dict[str, type[CallerSerializer]] = {
    "twilio": TwilioCallerSerializer,
    "telnyx": TelnyxCallerSerializer,
    "vonage": VonageCallerSerializer,
    "plivo": PlivoCallerSerializer,
    "exotel": ExotelCallerSerializer,
    "native": NativeCallerSerializer,
    "audiosocket": AudioSocketCallerSerializer,
    "webrtc": WebRtcCallerSerializer,
    "sip": SipCallerSerializer,
}


def make_serializer(name: str, **options: object) -> Serializer:
    """A fresh serializer for one call; unknown names raise ValueError."""
    return _named(SERIALIZERS, name)(**options)


def make_caller_serializer(name: str, call_id: str | None = None, params: dict[str, Any] | None = None,
                           token: str | None = None) -> CallerSerializer:
    """A fresh caller's end for one call (a new call id when none is given); unknown names raise ValueError."""
    return caller_serializer_class(name)(call_id, params, token)


def caller_serializer_class(name: str) -> type[CallerSerializer]:
    return _named(CALLER_SERIALIZERS, name)


def _named(table: dict[str, type], name: str) -> type:
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown transport {name!r}; expected one of: {', '.join(table)}") from None


__all__ = [
    "CALLER_SERIALIZERS",
    "SERIALIZERS",
    "AudioSocketCallerSerializer",
    "AudioSocketSerializer",
    "CallerSerializer",
    "ChunkPolicy",
    "DecodeResult",
    "ExotelCallerSerializer",
    "ExotelSerializer",
    "NativeCallerSerializer",
    "NativeSerializer",
    "PlivoCallerSerializer",
    "PlivoSerializer",
    "Serializer",
    "SipCallerSerializer",
    "TelnyxCallerSerializer",
    "TelnyxSerializer",
    "TwilioCallerSerializer",
    "TwilioSerializer",
    "VonageCallerSerializer",
    "VonageSerializer",
    "WebRtcCallerSerializer",
    "caller_serializer_class",
    "make_caller_serializer",
    "make_serializer",
]
