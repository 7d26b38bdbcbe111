"""vad room: streaming Silero VAD and the end-of-turn decision (see DESIGN.md)."""

from voicepipe.vad.samples import AudioInputError
from voicepipe.vad.silero import SileroVAD, TurnDetector, VADEvent, VADStream
from voicepipe.vad.turn import EndOfTurnPolicy, SilenceEndOfTurn, TurnView

__all__ = ["AudioInputError", "EndOfTurnPolicy", "SileroVAD", "SilenceEndOfTurn", "TurnDetector", "TurnView",
           "VADEvent", "VADStream"]
