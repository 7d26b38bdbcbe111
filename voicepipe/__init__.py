"""voicepipe: a one-process voice-agent inference service."""

__version__ = "0.1.0"
