"""tts room: text chunker, streaming Piper synthesis, sample-accurate playout cursor (see docs/architecture.md)."""

from voicepipe.tts.chunker import TextChunk, TextChunker
from voicepipe.tts.cursor import Heard, PlayoutCursor, SpeechOrigin, WordTiming
from voicepipe.tts.synthesizer import AudioFrame, ClauseAudio, SpeechStream, Synthesizer
from voicepipe.tts.voice import load_aligned_voice

__all__ = ["AudioFrame", "ClauseAudio", "Heard", "PlayoutCursor", "SpeechOrigin", "SpeechStream", "Synthesizer",
           "TextChunk", "TextChunker", "WordTiming", "load_aligned_voice"]
