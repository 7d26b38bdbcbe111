"""One pure serializer per provider, by name."""

from voicepipe.transports.serializers.audiosocket import AudioSocketSerializer
from voicepipe.transports.serializers.base import ChunkPolicy, DecodeResult, Serializer
from voicepipe.transports.serializers.exotel import ExotelSerializer
from voicepipe.transports.serializers.native import NativeSerializer
from voicepipe.transports.serializers.plivo import PlivoSerializer
from voicepipe.transports.serializers.telnyx import TelnyxSerializer
from voicepipe.transports.serializers.twilio import TwilioSerializer
from voicepipe.transports.serializers.vonage import VonageSerializer

SERIALIZERS: dict[str, type[Serializer]] = {
    "twilio": TwilioSerializer,
    "telnyx": TelnyxSerializer,
    "vonage": VonageSerializer,
    "plivo": PlivoSerializer,
    "exotel": ExotelSerializer,
    "native": NativeSerializer,
    "audiosocket": AudioSocketSerializer,
}


def make_serializer(name: str, **options: object) -> Serializer:
    """A fresh serializer for one call; unknown names raise ValueError."""
    try:
        cls = SERIALIZERS[name]
    except KeyError:
        raise ValueError(f"unknown transport {name!r}; expected one of: {', '.join(SERIALIZERS)}") from None
    return cls(**options)


__all__ = [
    "SERIALIZERS",
    "AudioSocketSerializer",
    "ChunkPolicy",
    "DecodeResult",
    "ExotelSerializer",
    "NativeSerializer",
    "PlivoSerializer",
    "Serializer",
    "TelnyxSerializer",
    "TwilioSerializer",
    "VonageSerializer",
    "make_serializer",
]
