"""The remote LLM backend (`llm.backend = "openai"`): the engine interface calls use, over an OpenAI-compatible
server. See `engine.py`."""

from voicepipe.llm.remote.engine import RemoteEngine, RemoteSession
from voicepipe.llm.remote.stream import RemoteBackendError

__all__ = ["RemoteBackendError", "RemoteEngine", "RemoteSession"]
