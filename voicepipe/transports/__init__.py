"""transports room (see docs/architecture.md): pure per-provider serializers (both ends of each wire format: the
server's, and the caller's that voicepipe/caller/ speaks), the playback controller, and the events they speak. The
WebSocket gateway, WebRTC and the AudioSocket listener build on these and do the I/O (connection.py)."""

from voicepipe.transports.events import (
    REACTIONS,
    Cleared,
    Connected,
    Dtmf,
    Event,
    Mark,
    Media,
    ProtocolError,
    Start,
    Stop,
    TransportError,
)
from voicepipe.transports.playback import Chunk, ClearResult, Heard, MarkStatus, PlaybackController
from voicepipe.transports.serializers import SERIALIZERS, ChunkPolicy, DecodeResult, Serializer, make_serializer

__all__ = [
    "REACTIONS",
    "SERIALIZERS",
    "Chunk",
    "ChunkPolicy",
    "ClearResult",
    "Cleared",
    "Connected",
    "DecodeResult",
    "Dtmf",
    "Event",
    "Heard",
    "Mark",
    "MarkStatus",
    "Media",
    "PlaybackController",
    "ProtocolError",
    "Serializer",
    "Start",
    "Stop",
    "TransportError",
    "make_serializer",
]
