"""OpenAI-compatible HTTP API on the voicepipe engine: /v1/chat/completions, /v1/completions, /v1/models."""

from voicepipe.llm.api.router import create_openai_router

__all__ = ["create_openai_router"]
