"""vad room: streaming Silero VAD and its turn detector (the end-of-turn policy: turns/; docs/architecture.md)."""

from voicepipe.vad.samples import AudioInputError
from voicepipe.vad.silero import SileroVAD, TurnDetector, VADEvent, VADStream
from voicepipe.vad.turn import EndOfTurnPolicy, SilenceEndOfTurn, TurnView

__all__ = ["AudioInputError", "EndOfTurnPolicy", "SileroVAD", "SilenceEndOfTurn", "TurnDetector", "TurnView",
           "VADEvent", "VADStream"]
