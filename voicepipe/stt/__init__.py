"""stt room: streaming faster-whisper transcription, partial and final transcripts (see docs/architecture.md)."""

from voicepipe.stt.agreement import LocalAgreement, Word, group_words
from voicepipe.stt.transcriber import STTOverloaded, Transcriber, TranscriberStats, Transcript, TranscriptStream
from voicepipe.stt.wer import corpus_wer, normalize_words, wer

__all__ = ["LocalAgreement", "STTOverloaded", "Transcriber", "TranscriberStats", "Transcript", "TranscriptStream",
           "Word", "corpus_wer", "group_words", "normalize_words", "wer"]
